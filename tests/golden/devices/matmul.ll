// ---- kernel 0
; kernel eqk


define void @eqk(ptr noalias %p0, ptr noalias readonly %p1, ptr noalias readonly %p2, i64 %lo, i64 %hi) nounwind {
entry:
  %a3 = alloca float
  %a4 = alloca float
  %a5 = alloca float
  %a6 = alloca float
  %a7 = alloca float
  %a8 = alloca float
  %a9 = alloca float
  %a10 = alloca float
  %r11.p = alloca i64
  store float 0x0000000000000000, ptr %a3
  store float 0x0000000000000000, ptr %a4
  store float 0x0000000000000000, ptr %a5
  store float 0x0000000000000000, ptr %a6
  store float 0x0000000000000000, ptr %a7
  store float 0x0000000000000000, ptr %a8
  store float 0x0000000000000000, ptr %a9
  store float 0x0000000000000000, ptr %a10
  store i64 0, ptr %r11.p
  br label %L11.cond
L11.cond:
  %r11 = load i64, ptr %r11.p
  %r11.c = icmp slt i64 %r11, 8
  br i1 %r11.c, label %L11.body, label %L11.exit
L11.body:
  %t1 = getelementptr inbounds float, ptr %p1, i64 %r11
  %t2 = load float, ptr %t1
  %t3 = mul i64 %r11, 4
  %t4 = getelementptr inbounds float, ptr %p2, i64 %t3
  %t5 = load float, ptr %t4
  %t6 = fmul contract float %t2, %t5
  %t7 = add i64 %t3, 1
  %t8 = getelementptr inbounds float, ptr %p2, i64 %t7
  %t9 = load float, ptr %t8
  %t10 = fmul contract float %t2, %t9
  %t11 = add i64 %t3, 2
  %t12 = getelementptr inbounds float, ptr %p2, i64 %t11
  %t13 = load float, ptr %t12
  %t14 = fmul contract float %t2, %t13
  %t15 = add i64 %t3, 3
  %t16 = getelementptr inbounds float, ptr %p2, i64 %t15
  %t17 = load float, ptr %t16
  %t18 = fmul contract float %t2, %t17
  %t19 = add i64 %r11, 8
  %t20 = getelementptr inbounds float, ptr %p1, i64 %t19
  %t21 = load float, ptr %t20
  %t22 = fmul contract float %t21, %t5
  %t23 = fmul contract float %t21, %t9
  %t24 = fmul contract float %t21, %t13
  %t25 = fmul contract float %t21, %t17
  %t26 = load float, ptr %a3
  %t27 = fadd reassoc nsz contract float %t26, %t6
  store float %t27, ptr %a3
  %t28 = load float, ptr %a4
  %t29 = fadd reassoc nsz contract float %t28, %t10
  store float %t29, ptr %a4
  %t30 = load float, ptr %a5
  %t31 = fadd reassoc nsz contract float %t30, %t14
  store float %t31, ptr %a5
  %t32 = load float, ptr %a6
  %t33 = fadd reassoc nsz contract float %t32, %t18
  store float %t33, ptr %a6
  %t34 = load float, ptr %a7
  %t35 = fadd reassoc nsz contract float %t34, %t22
  store float %t35, ptr %a7
  %t36 = load float, ptr %a8
  %t37 = fadd reassoc nsz contract float %t36, %t23
  store float %t37, ptr %a8
  %t38 = load float, ptr %a9
  %t39 = fadd reassoc nsz contract float %t38, %t24
  store float %t39, ptr %a9
  %t40 = load float, ptr %a10
  %t41 = fadd reassoc nsz contract float %t40, %t25
  store float %t41, ptr %a10
  %r11.n = add nuw nsw i64 %r11, 1
  store i64 %r11.n, ptr %r11.p
  br label %L11.cond, !llvm.loop !0
L11.exit:
  %t42 = load float, ptr %a3
  %t43 = load float, ptr %a4
  %t44 = load float, ptr %a5
  %t45 = load float, ptr %a6
  %t46 = load float, ptr %a7
  %t47 = load float, ptr %a8
  %t48 = load float, ptr %a9
  %t49 = load float, ptr %a10
  %t50 = getelementptr inbounds float, ptr %p0, i64 0
  store float %t42, ptr %t50
  %t51 = getelementptr inbounds float, ptr %p0, i64 1
  store float %t43, ptr %t51
  %t52 = getelementptr inbounds float, ptr %p0, i64 2
  store float %t44, ptr %t52
  %t53 = getelementptr inbounds float, ptr %p0, i64 3
  store float %t45, ptr %t53
  %t54 = getelementptr inbounds float, ptr %p0, i64 4
  store float %t46, ptr %t54
  %t55 = getelementptr inbounds float, ptr %p0, i64 5
  store float %t47, ptr %t55
  %t56 = getelementptr inbounds float, ptr %p0, i64 6
  store float %t48, ptr %t56
  %t57 = getelementptr inbounds float, ptr %p0, i64 7
  store float %t49, ptr %t57
  ret void
}

!0 = distinct !{!0, !1, !2}
!1 = !{!"llvm.loop.mustprogress"}
!2 = !{!"llvm.loop.vectorize.width", i32 1}
!4 = distinct !{!4, !1, !2, !5}
!5 = !{!"llvm.loop.unroll.disable"}

