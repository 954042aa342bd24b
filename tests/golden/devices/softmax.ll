// ---- kernel 0
; kernel eqk
declare float @llvm.floor.f32(float)
declare float @llvm.maximum.f32(float, float)

define void @eqk(ptr noalias %p0, ptr noalias readonly %p1, ptr noalias readonly %p2, i64 %lo, i64 %hi) nounwind {
entry:
  %r3.p = alloca i64
  %a4 = alloca float
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
  store float 0xFFF0000000000000, ptr %a4
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
  %t5 = load float, ptr %a4
  %t6 = call float @llvm.maximum.f32(float %t5, float %t4)
  store float %t6, ptr %a4
  %r5.n = add nuw nsw i64 %r5, 1
  store i64 %r5.n, ptr %r5.p
  br label %L5.cond, !llvm.loop !0
L5.exit:
  %t7 = load float, ptr %a4
  store float 0x0000000000000000, ptr %a13
  store i64 0, ptr %r14.p
  br label %L14.cond
L14.cond:
  %r14 = load i64, ptr %r14.p
  %r14.c = icmp slt i64 %r14, 8
  br i1 %r14.c, label %L14.body, label %L14.exit
L14.body:
  %t8 = mul i64 %r3, 8
  %t9 = add i64 %t8, %r14
  %t10 = getelementptr inbounds float, ptr %p1, i64 %t9
  %t11 = load float, ptr %t10
  %t12 = fneg float %t7
  %t13 = fadd contract float %t11, %t12
  %t14 = getelementptr inbounds float, ptr %p2, i64 0
  %t15 = load float, ptr %t14
  %t16 = fmul contract float %t13, %t15
  %t17 = fcmp olt float 0x4060000000000000, %t16
  %t18 = select i1 %t17, float 0x4060000000000000, float %t16
  %t19 = fcmp olt float %t18, 0xC05FC00000000000
  %t20 = select i1 %t19, float 0xC05FC00000000000, float %t18
  %t21 = call float @llvm.floor.f32(float %t20)
  %t22 = fneg float %t21
  %t23 = fadd contract float %t20, %t22
  %t24 = fmul contract float 0x3F2C6E2920000000, %t23
  %t25 = fadd contract float %t24, 0x3F546301C0000000
  %t26 = fmul contract float %t25, %t23
  %t27 = fadd contract float %t26, 0x3F83D24EA0000000
  %t28 = fmul contract float %t27, %t23
  %t29 = fadd contract float %t28, 0x3FAC685620000000
  %t30 = fmul contract float %t29, %t23
  %t31 = fadd contract float %t30, 0x3FCEBFD9A0000000
  %t32 = fmul contract float %t31, %t23
  %t33 = fadd contract float %t32, 0x3FE62E42A0000000
  %t34 = fmul contract float %t33, %t23
  %t35 = fadd contract float %t34, 0x3FF0000000000000
  %t36 = fadd contract float %t21, 0x4168000FE0000000
  %t37 = bitcast float %t36 to i32
  %t38 = shl i32 %t37, 23
  %t39 = bitcast i32 %t38 to float
  %t40 = fmul contract float %t35, %t39
  %t41 = getelementptr inbounds float, ptr %p0, i64 %t9
  store float %t40, ptr %t41
  %t42 = load float, ptr %a13
  %t43 = fadd reassoc nsz contract float %t42, %t40
  store float %t43, ptr %a13
  %r14.n = add nuw nsw i64 %r14, 1
  store i64 %r14.n, ptr %r14.p
  br label %L14.cond, !llvm.loop !0
L14.exit:
  %t44 = load float, ptr %a13
  store i64 0, ptr %r59.p
  br label %L59.cond
L59.cond:
  %r59 = load i64, ptr %r59.p
  %r59.c = icmp slt i64 %r59, 8
  br i1 %r59.c, label %L59.body, label %L59.exit
L59.body:
  %t45 = mul i64 %r3, 8
  %t46 = add i64 %t45, %r59
  %t47 = getelementptr inbounds float, ptr %p0, i64 %t46
  %t48 = load float, ptr %t47
  %t49 = fdiv float 1.0, %t44
  %t50 = fmul contract float %t48, %t49
  %t51 = getelementptr inbounds float, ptr %p0, i64 %t46
  store float %t50, ptr %t51
  %r59.n = add nuw nsw i64 %r59, 1
  store i64 %r59.n, ptr %r59.p
  br label %L59.cond, !llvm.loop !0
L59.exit:
  %r3.n = add nuw nsw i64 %r3, 1
  store i64 %r3.n, ptr %r3.p
  br label %L3.cond, !llvm.loop !4
L3.exit:
  ret void
}

!0 = distinct !{!0, !1}
!1 = !{!"llvm.loop.mustprogress"}
!2 = !{!"llvm.loop.interleave.count", i32 4}
!3 = distinct !{!3, !1, !2}
!4 = distinct !{!4, !1, !5}
!5 = !{!"llvm.loop.unroll.disable"}

