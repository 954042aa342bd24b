// ---- kernel 0
; kernel eqk
declare float @llvm.floor.f32(float)
declare i32 @llvm.smax.i32(i32, i32)

define void @eqk(ptr noalias %p0, ptr noalias readonly %p1, ptr noalias readonly %p2, i64 %lo, i64 %hi) nounwind {
entry:
  %r3.p = alloca i64
  %a4 = alloca i32
  %r5.p = alloca i64
  %a13 = alloca float
  %r14.p = alloca i64
  %r59.p = alloca i64
  store i64 %lo, ptr %r3.p
  br label %L3.cond
L3.cond:
  %r3 = load i64, ptr %r3.p
  %r3.c = icmp slt i64 %r3, %hi
  br i1 %r3.c, label %L3.body, label %L3.exit
L3.body:
  store i32 -2139095041, ptr %a4
  store i64 0, ptr %r5.p
  br label %L5.cond
L5.cond:
  %r5 = load i64, ptr %r5.p
  %r5.c = icmp slt i64 %r5, 8
  br i1 %r5.c, label %L5.body, label %L5.exit
L5.body:
  %t1 = mul i64 %r3, 8
  %t2 = add i64 %t1, %r5
  %t3 = getelementptr inbounds float, ptr %p1, i64 %t2
  %t4 = load float, ptr %t3
  %t5 = fcmp uno float %t4, %t4
  %t6 = select i1 %t5, float 0x7FF8000000000000, float %t4
  %t7 = bitcast float %t6 to i32
  %t8 = ashr i32 %t7, 31
  %t9 = lshr i32 %t8, 1
  %t10 = xor i32 %t7, %t9
  %t11 = load i32, ptr %a4
  %t12 = call i32 @llvm.smax.i32(i32 %t11, i32 %t10)
  store i32 %t12, ptr %a4
  %r5.n = add nuw nsw i64 %r5, 1
  store i64 %r5.n, ptr %r5.p
  br label %L5.cond, !llvm.loop !0
L5.exit:
  %t13 = load i32, ptr %a4
  %t14 = ashr i32 %t13, 31
  %t15 = lshr i32 %t14, 1
  %t16 = xor i32 %t13, %t15
  %t17 = bitcast i32 %t16 to float
  store float 0x0000000000000000, ptr %a13
  store i64 0, ptr %r14.p
  br label %L14.cond
L14.cond:
  %r14 = load i64, ptr %r14.p
  %r14.c = icmp slt i64 %r14, 8
  br i1 %r14.c, label %L14.body, label %L14.exit
L14.body:
  %t18 = mul i64 %r3, 8
  %t19 = add i64 %t18, %r14
  %t20 = getelementptr inbounds float, ptr %p1, i64 %t19
  %t21 = load float, ptr %t20
  %t22 = fneg float %t17
  %t23 = fadd contract float %t21, %t22
  %t24 = getelementptr inbounds float, ptr %p2, i64 0
  %t25 = load float, ptr %t24
  %t26 = fmul contract float %t23, %t25
  %t27 = fcmp olt float 0x4060000000000000, %t26
  %t28 = select i1 %t27, float 0x4060000000000000, float %t26
  %t29 = fcmp olt float %t28, 0xC05FC00000000000
  %t30 = select i1 %t29, float 0xC05FC00000000000, float %t28
  %t31 = call float @llvm.floor.f32(float %t30)
  %t32 = fneg float %t31
  %t33 = fadd contract float %t30, %t32
  %t34 = fmul contract float 0x3F2C6E2920000000, %t33
  %t35 = fadd contract float %t34, 0x3F546301C0000000
  %t36 = fmul contract float %t35, %t33
  %t37 = fadd contract float %t36, 0x3F83D24EA0000000
  %t38 = fmul contract float %t37, %t33
  %t39 = fadd contract float %t38, 0x3FAC685620000000
  %t40 = fmul contract float %t39, %t33
  %t41 = fadd contract float %t40, 0x3FCEBFD9A0000000
  %t42 = fmul contract float %t41, %t33
  %t43 = fadd contract float %t42, 0x3FE62E42A0000000
  %t44 = fmul contract float %t43, %t33
  %t45 = fadd contract float %t44, 0x3FF0000000000000
  %t46 = fadd contract float %t31, 0x4168000FE0000000
  %t47 = bitcast float %t46 to i32
  %t48 = shl i32 %t47, 23
  %t49 = bitcast i32 %t48 to float
  %t50 = fmul contract float %t45, %t49
  %t51 = getelementptr inbounds float, ptr %p0, i64 %t19
  store float %t50, ptr %t51
  %t52 = load float, ptr %a13
  %t53 = fadd reassoc contract float %t52, %t50
  store float %t53, ptr %a13
  %r14.n = add nuw nsw i64 %r14, 1
  store i64 %r14.n, ptr %r14.p
  br label %L14.cond, !llvm.loop !0
L14.exit:
  %t54 = load float, ptr %a13
  store i64 0, ptr %r59.p
  br label %L59.cond
L59.cond:
  %r59 = load i64, ptr %r59.p
  %r59.c = icmp slt i64 %r59, 8
  br i1 %r59.c, label %L59.body, label %L59.exit
L59.body:
  %t55 = mul i64 %r3, 8
  %t56 = add i64 %t55, %r59
  %t57 = getelementptr inbounds float, ptr %p0, i64 %t56
  %t58 = load float, ptr %t57
  %t59 = fdiv float 1.0, %t54
  %t60 = fmul contract float %t58, %t59
  %t61 = getelementptr inbounds float, ptr %p0, i64 %t56
  store float %t60, ptr %t61
  %r59.n = add nuw nsw i64 %r59, 1
  store i64 %r59.n, ptr %r59.p
  br label %L59.cond, !llvm.loop !0
L59.exit:
  %r3.n = add nuw nsw i64 %r3, 1
  store i64 %r3.n, ptr %r3.p
  br label %L3.cond, !llvm.loop !6
L3.exit:
  ret void
}

!0 = distinct !{!0, !1}
!1 = !{!"llvm.loop.mustprogress"}
!2 = !{!"llvm.loop.interleave.count", i32 4}
!3 = distinct !{!3, !1, !2}
!4 = distinct !{!4, !1, !5}
!5 = !{!"llvm.loop.unroll.disable"}
!6 = distinct !{!6, !1, !5, !7}
!7 = !{!"llvm.loop.vectorize.width", i32 1}

