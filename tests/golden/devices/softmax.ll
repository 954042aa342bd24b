// ---- kernel 0
; kernel eqk
declare float @llvm.floor.f32(float)
declare float @llvm.maximum.f32(float, float)

define void @eqk(ptr noalias %p0, ptr noalias readonly %p1, i64 %lo, i64 %hi) nounwind {
entry:
  %r2.p = alloca i64
  %a3 = alloca float
  %r4.p = alloca i64
  %a12 = alloca float
  %r13.p = alloca i64
  %r56.p = alloca i64
  store i64 %lo, ptr %r2.p
  br label %L2.cond
L2.cond:
  %r2 = load i64, ptr %r2.p
  %r2.c = icmp slt i64 %r2, %hi
  br i1 %r2.c, label %L2.body, label %L2.exit
L2.body:
  store float 0xFFF0000000000000, ptr %a3
  store i64 0, ptr %r4.p
  br label %L4.cond
L4.cond:
  %r4 = load i64, ptr %r4.p
  %r4.c = icmp slt i64 %r4, 8
  br i1 %r4.c, label %L4.body, label %L4.exit
L4.body:
  %t1 = mul i64 %r2, 8
  %t2 = add i64 %t1, %r4
  %t3 = getelementptr inbounds float, ptr %p1, i64 %t2
  %t4 = load float, ptr %t3
  %t5 = load float, ptr %a3
  %t6 = call float @llvm.maximum.f32(float %t5, float %t4)
  store float %t6, ptr %a3
  %r4.n = add nuw nsw i64 %r4, 1
  store i64 %r4.n, ptr %r4.p
  br label %L4.cond, !llvm.loop !0
L4.exit:
  %t7 = load float, ptr %a3
  store float 0x0000000000000000, ptr %a12
  store i64 0, ptr %r13.p
  br label %L13.cond
L13.cond:
  %r13 = load i64, ptr %r13.p
  %r13.c = icmp slt i64 %r13, 8
  br i1 %r13.c, label %L13.body, label %L13.exit
L13.body:
  %t8 = mul i64 %r2, 8
  %t9 = add i64 %t8, %r13
  %t10 = getelementptr inbounds float, ptr %p1, i64 %t9
  %t11 = load float, ptr %t10
  %t12 = fneg float %t7
  %t13 = fadd contract float %t11, %t12
  %t14 = fmul contract float %t13, 0x3FF7154760000000
  %t15 = fcmp olt float 0x4060000000000000, %t14
  %t16 = select i1 %t15, float 0x4060000000000000, float %t14
  %t17 = fcmp olt float %t16, 0xC05FC00000000000
  %t18 = select i1 %t17, float 0xC05FC00000000000, float %t16
  %t19 = call float @llvm.floor.f32(float %t18)
  %t20 = fneg float %t19
  %t21 = fadd contract float %t18, %t20
  %t22 = fmul contract float 0x3F2C6E2920000000, %t21
  %t23 = fadd contract float %t22, 0x3F546301C0000000
  %t24 = fmul contract float %t23, %t21
  %t25 = fadd contract float %t24, 0x3F83D24EA0000000
  %t26 = fmul contract float %t25, %t21
  %t27 = fadd contract float %t26, 0x3FAC685620000000
  %t28 = fmul contract float %t27, %t21
  %t29 = fadd contract float %t28, 0x3FCEBFD9A0000000
  %t30 = fmul contract float %t29, %t21
  %t31 = fadd contract float %t30, 0x3FE62E42A0000000
  %t32 = fmul contract float %t31, %t21
  %t33 = fadd contract float %t32, 0x3FF0000000000000
  %t34 = fadd contract float %t19, 0x4168000FE0000000
  %t35 = bitcast float %t34 to i32
  %t36 = shl i32 %t35, 23
  %t37 = bitcast i32 %t36 to float
  %t38 = fmul contract float %t33, %t37
  %t39 = load float, ptr %a12
  %t40 = fadd reassoc nsz contract float %t39, %t38
  store float %t40, ptr %a12
  %r13.n = add nuw nsw i64 %r13, 1
  store i64 %r13.n, ptr %r13.p
  br label %L13.cond, !llvm.loop !0
L13.exit:
  %t41 = load float, ptr %a12
  store i64 0, ptr %r56.p
  br label %L56.cond
L56.cond:
  %r56 = load i64, ptr %r56.p
  %r56.c = icmp slt i64 %r56, 8
  br i1 %r56.c, label %L56.body, label %L56.exit
L56.body:
  %t42 = mul i64 %r2, 8
  %t43 = add i64 %t42, %r56
  %t44 = getelementptr inbounds float, ptr %p1, i64 %t43
  %t45 = load float, ptr %t44
  %t46 = fneg float %t7
  %t47 = fadd contract float %t45, %t46
  %t48 = fmul contract float %t47, 0x3FF7154760000000
  %t49 = fcmp olt float 0x4060000000000000, %t48
  %t50 = select i1 %t49, float 0x4060000000000000, float %t48
  %t51 = fcmp olt float %t50, 0xC05FC00000000000
  %t52 = select i1 %t51, float 0xC05FC00000000000, float %t50
  %t53 = call float @llvm.floor.f32(float %t52)
  %t54 = fneg float %t53
  %t55 = fadd contract float %t52, %t54
  %t56 = fmul contract float 0x3F2C6E2920000000, %t55
  %t57 = fadd contract float %t56, 0x3F546301C0000000
  %t58 = fmul contract float %t57, %t55
  %t59 = fadd contract float %t58, 0x3F83D24EA0000000
  %t60 = fmul contract float %t59, %t55
  %t61 = fadd contract float %t60, 0x3FAC685620000000
  %t62 = fmul contract float %t61, %t55
  %t63 = fadd contract float %t62, 0x3FCEBFD9A0000000
  %t64 = fmul contract float %t63, %t55
  %t65 = fadd contract float %t64, 0x3FE62E42A0000000
  %t66 = fmul contract float %t65, %t55
  %t67 = fadd contract float %t66, 0x3FF0000000000000
  %t68 = fadd contract float %t53, 0x4168000FE0000000
  %t69 = bitcast float %t68 to i32
  %t70 = shl i32 %t69, 23
  %t71 = bitcast i32 %t70 to float
  %t72 = fmul contract float %t67, %t71
  %t73 = fdiv float 1.0, %t41
  %t74 = fmul contract float %t72, %t73
  %t75 = getelementptr inbounds float, ptr %p0, i64 %t43
  store float %t74, ptr %t75
  %r56.n = add nuw nsw i64 %r56, 1
  store i64 %r56.n, ptr %r56.p
  br label %L56.cond, !llvm.loop !0
L56.exit:
  %r2.n = add nuw nsw i64 %r2, 1
  store i64 %r2.n, ptr %r2.p
  br label %L2.cond, !llvm.loop !0
L2.exit:
  ret void
}

!0 = distinct !{!0, !1}
!1 = !{!"llvm.loop.mustprogress"}
!2 = !{!"llvm.loop.interleave.count", i32 4}
!3 = distinct !{!3, !1, !2}

