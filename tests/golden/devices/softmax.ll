// ---- kernel 0
; kernel eqk
declare float @llvm.maximum.f32(float, float)

define void @eqk(ptr noalias %p0, ptr noalias readonly %p1, i64 %lo, i64 %hi) nounwind {
entry:
  %r2.p = alloca i64
  %a3 = alloca float
  %r4.p = alloca i64
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
  %t8 = getelementptr inbounds float, ptr %p0, i64 %r2
  store float %t7, ptr %t8
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

// ---- kernel 1
; kernel eqk
declare float @llvm.floor.f32(float)

define void @eqk(ptr noalias %p0, ptr noalias readonly %p1, ptr noalias readonly %p2, i64 %lo, i64 %hi) nounwind {
entry:
  %r3.p = alloca i64
  %a4 = alloca float
  %r5.p = alloca i64
  store i64 %lo, ptr %r3.p
  br label %L3.cond
L3.cond:
  %r3 = load i64, ptr %r3.p
  %r3.c = icmp slt i64 %r3, %hi
  br i1 %r3.c, label %L3.body, label %L3.exit
L3.body:
  store float 0x0000000000000000, ptr %a4
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
  %t5 = getelementptr inbounds float, ptr %p2, i64 %r3
  %t6 = load float, ptr %t5
  %t7 = fneg float %t6
  %t8 = fadd contract float %t4, %t7
  %t9 = fmul contract float %t8, 0x3FF7154760000000
  %t10 = fcmp ogt float %t9, 128.0
  %t11 = select i1 %t10, float 128.0, float %t9
  %t12 = fcmp olt float %t11, -127.0
  %t13 = select i1 %t12, float -127.0, float %t11
  %t14 = call float @llvm.floor.f32(float %t13)
  %t15 = fsub float %t13, %t14
  %t16 = fmul contract float 0x3F2C6E2920000000, %t15
  %t17 = fadd contract float %t16, 0x3F546301C0000000
  %t18 = fmul contract float %t17, %t15
  %t19 = fadd contract float %t18, 0x3F83D24EA0000000
  %t20 = fmul contract float %t19, %t15
  %t21 = fadd contract float %t20, 0x3FAC685620000000
  %t22 = fmul contract float %t21, %t15
  %t23 = fadd contract float %t22, 0x3FCEBFD9A0000000
  %t24 = fmul contract float %t23, %t15
  %t25 = fadd contract float %t24, 0x3FE62E42A0000000
  %t26 = fmul contract float %t25, %t15
  %t27 = fadd contract float %t26, 0x3FF0000000000000
  %t28 = fadd float %t14, 0x4168000FE0000000
  %t29 = bitcast float %t28 to i32
  %t30 = shl i32 %t29, 23
  %t31 = bitcast i32 %t30 to float
  %t32 = fmul float %t27, %t31
  %t33 = load float, ptr %a4
  %t34 = fadd reassoc nsz contract float %t33, %t32
  store float %t34, ptr %a4
  %r5.n = add nuw nsw i64 %r5, 1
  store i64 %r5.n, ptr %r5.p
  br label %L5.cond, !llvm.loop !0
L5.exit:
  %t35 = load float, ptr %a4
  %t36 = getelementptr inbounds float, ptr %p0, i64 %r3
  store float %t35, ptr %t36
  %r3.n = add nuw nsw i64 %r3, 1
  store i64 %r3.n, ptr %r3.p
  br label %L3.cond, !llvm.loop !0
L3.exit:
  ret void
}

!0 = distinct !{!0, !1}
!1 = !{!"llvm.loop.mustprogress"}
!2 = !{!"llvm.loop.interleave.count", i32 4}
!3 = distinct !{!3, !1, !2}

// ---- kernel 2
; kernel eqk
declare float @llvm.floor.f32(float)

define void @eqk(ptr noalias %p0, ptr noalias readonly %p1, ptr noalias readonly %p2, ptr noalias readonly %p3, i64 %lo, i64 %hi) nounwind {
entry:
  %r4.p = alloca i64
  %r5.p = alloca i64
  store i64 %lo, ptr %r4.p
  br label %L4.cond
L4.cond:
  %r4 = load i64, ptr %r4.p
  %r4.c = icmp slt i64 %r4, %hi
  br i1 %r4.c, label %L4.body, label %L4.exit
L4.body:
  store i64 0, ptr %r5.p
  br label %L5.cond
L5.cond:
  %r5 = load i64, ptr %r5.p
  %r5.c = icmp slt i64 %r5, 8
  br i1 %r5.c, label %L5.body, label %L5.exit
L5.body:
  %t1 = mul i64 %r4, 8
  %t2 = add i64 %t1, %r5
  %t3 = getelementptr inbounds float, ptr %p1, i64 %t2
  %t4 = load float, ptr %t3
  %t5 = getelementptr inbounds float, ptr %p2, i64 %r4
  %t6 = load float, ptr %t5
  %t7 = fneg float %t6
  %t8 = fadd contract float %t4, %t7
  %t9 = fmul contract float %t8, 0x3FF7154760000000
  %t10 = fcmp ogt float %t9, 128.0
  %t11 = select i1 %t10, float 128.0, float %t9
  %t12 = fcmp olt float %t11, -127.0
  %t13 = select i1 %t12, float -127.0, float %t11
  %t14 = call float @llvm.floor.f32(float %t13)
  %t15 = fsub float %t13, %t14
  %t16 = fmul contract float 0x3F2C6E2920000000, %t15
  %t17 = fadd contract float %t16, 0x3F546301C0000000
  %t18 = fmul contract float %t17, %t15
  %t19 = fadd contract float %t18, 0x3F83D24EA0000000
  %t20 = fmul contract float %t19, %t15
  %t21 = fadd contract float %t20, 0x3FAC685620000000
  %t22 = fmul contract float %t21, %t15
  %t23 = fadd contract float %t22, 0x3FCEBFD9A0000000
  %t24 = fmul contract float %t23, %t15
  %t25 = fadd contract float %t24, 0x3FE62E42A0000000
  %t26 = fmul contract float %t25, %t15
  %t27 = fadd contract float %t26, 0x3FF0000000000000
  %t28 = fadd float %t14, 0x4168000FE0000000
  %t29 = bitcast float %t28 to i32
  %t30 = shl i32 %t29, 23
  %t31 = bitcast i32 %t30 to float
  %t32 = fmul float %t27, %t31
  %t33 = getelementptr inbounds float, ptr %p3, i64 %r4
  %t34 = load float, ptr %t33
  %t35 = fdiv float 1.0, %t34
  %t36 = fmul contract float %t32, %t35
  %t37 = getelementptr inbounds float, ptr %p0, i64 %t2
  store float %t36, ptr %t37
  %r5.n = add nuw nsw i64 %r5, 1
  store i64 %r5.n, ptr %r5.p
  br label %L5.cond, !llvm.loop !0
L5.exit:
  %r4.n = add nuw nsw i64 %r4, 1
  store i64 %r4.n, ptr %r4.p
  br label %L4.cond, !llvm.loop !0
L4.exit:
  ret void
}

!0 = distinct !{!0, !1}
!1 = !{!"llvm.loop.mustprogress"}
!2 = !{!"llvm.loop.interleave.count", i32 4}
!3 = distinct !{!3, !1, !2}

