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
  %r26.p = alloca i64
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
  %t15 = fcmp ogt float %t14, 128.0
  %t16 = select i1 %t15, float 128.0, float %t14
  %t17 = fcmp olt float %t16, -127.0
  %t18 = select i1 %t17, float -127.0, float %t16
  %t19 = call float @llvm.floor.f32(float %t18)
  %t20 = fsub float %t18, %t19
  %t21 = fmul contract float 0x3F2C6E2920000000, %t20
  %t22 = fadd contract float %t21, 0x3F546301C0000000
  %t23 = fmul contract float %t22, %t20
  %t24 = fadd contract float %t23, 0x3F83D24EA0000000
  %t25 = fmul contract float %t24, %t20
  %t26 = fadd contract float %t25, 0x3FAC685620000000
  %t27 = fmul contract float %t26, %t20
  %t28 = fadd contract float %t27, 0x3FCEBFD9A0000000
  %t29 = fmul contract float %t28, %t20
  %t30 = fadd contract float %t29, 0x3FE62E42A0000000
  %t31 = fmul contract float %t30, %t20
  %t32 = fadd contract float %t31, 0x3FF0000000000000
  %t33 = fadd float %t19, 0x4168000FE0000000
  %t34 = bitcast float %t33 to i32
  %t35 = shl i32 %t34, 23
  %t36 = bitcast i32 %t35 to float
  %t37 = fmul float %t32, %t36
  %t38 = load float, ptr %a12
  %t39 = fadd reassoc nsz contract float %t38, %t37
  store float %t39, ptr %a12
  %r13.n = add nuw nsw i64 %r13, 1
  store i64 %r13.n, ptr %r13.p
  br label %L13.cond, !llvm.loop !0
L13.exit:
  %t40 = load float, ptr %a12
  store i64 0, ptr %r26.p
  br label %L26.cond
L26.cond:
  %r26 = load i64, ptr %r26.p
  %r26.c = icmp slt i64 %r26, 8
  br i1 %r26.c, label %L26.body, label %L26.exit
L26.body:
  %t41 = mul i64 %r2, 8
  %t42 = add i64 %t41, %r26
  %t43 = getelementptr inbounds float, ptr %p1, i64 %t42
  %t44 = load float, ptr %t43
  %t45 = fneg float %t7
  %t46 = fadd contract float %t44, %t45
  %t47 = fmul contract float %t46, 0x3FF7154760000000
  %t48 = fcmp ogt float %t47, 128.0
  %t49 = select i1 %t48, float 128.0, float %t47
  %t50 = fcmp olt float %t49, -127.0
  %t51 = select i1 %t50, float -127.0, float %t49
  %t52 = call float @llvm.floor.f32(float %t51)
  %t53 = fsub float %t51, %t52
  %t54 = fmul contract float 0x3F2C6E2920000000, %t53
  %t55 = fadd contract float %t54, 0x3F546301C0000000
  %t56 = fmul contract float %t55, %t53
  %t57 = fadd contract float %t56, 0x3F83D24EA0000000
  %t58 = fmul contract float %t57, %t53
  %t59 = fadd contract float %t58, 0x3FAC685620000000
  %t60 = fmul contract float %t59, %t53
  %t61 = fadd contract float %t60, 0x3FCEBFD9A0000000
  %t62 = fmul contract float %t61, %t53
  %t63 = fadd contract float %t62, 0x3FE62E42A0000000
  %t64 = fmul contract float %t63, %t53
  %t65 = fadd contract float %t64, 0x3FF0000000000000
  %t66 = fadd float %t52, 0x4168000FE0000000
  %t67 = bitcast float %t66 to i32
  %t68 = shl i32 %t67, 23
  %t69 = bitcast i32 %t68 to float
  %t70 = fmul float %t65, %t69
  %t71 = fdiv float 1.0, %t40
  %t72 = fmul contract float %t70, %t71
  %t73 = getelementptr inbounds float, ptr %p0, i64 %t42
  store float %t72, ptr %t73
  %r26.n = add nuw nsw i64 %r26, 1
  store i64 %r26.n, ptr %r26.p
  br label %L26.cond, !llvm.loop !0
L26.exit:
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

