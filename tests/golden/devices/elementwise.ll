// ---- kernel 0
; kernel eqk
declare float @llvm.floor.f32(float)

define void @eqk(ptr noalias %p0, ptr noalias readonly %p1, ptr noalias readonly %p2, ptr noalias readonly %p3, ptr noalias readonly %p4, ptr noalias readonly %p5, i64 %lo, i64 %hi) nounwind {
entry:
  %r6.p = alloca i64
  store i64 %lo, ptr %r6.p
  br label %L6.cond
L6.cond:
  %r6 = load i64, ptr %r6.p
  %r6.c = icmp slt i64 %r6, %hi
  br i1 %r6.c, label %L6.body, label %L6.exit
L6.body:
  %t1 = getelementptr inbounds float, ptr %p1, i64 %r6
  %t2 = load float, ptr %t1
  %t3 = getelementptr inbounds float, ptr %p2, i64 %r6
  %t4 = load float, ptr %t3
  %t5 = fmul contract float %t2, %t4
  %t6 = getelementptr inbounds float, ptr %p3, i64 %r6
  %t7 = load float, ptr %t6
  %t8 = fadd contract float %t5, %t7
  %t9 = fmul contract float %t8, 0x3FE0000000000000
  %t10 = getelementptr inbounds float, ptr %p4, i64 %r6
  %t11 = load float, ptr %t10
  %t12 = fneg float %t11
  %t13 = fadd contract float %t9, %t12
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
  %t33 = fcmp uno float %t14, 0.0
  %t34 = select i1 %t33, float 0.0, float %t19
  %t35 = fptosi float %t34 to i32
  %t36 = add i32 %t35, 127
  %t37 = shl i32 %t36, 23
  %t38 = bitcast i32 %t37 to float
  %t39 = fmul float %t32, %t38
  %t40 = select i1 %t33, float %t14, float %t39
  %t41 = getelementptr inbounds float, ptr %p5, i64 %r6
  %t42 = load float, ptr %t41
  %t43 = fcmp olt float %t42, 0x0000000000000000
  %t44 = fneg float %t42
  %t45 = select i1 %t43, float %t44, float %t42
  %t46 = fadd contract float %t40, %t45
  %t47 = fcmp olt float %t46, 0x3810000000000000
  %t48 = fmul float %t46, 0x4160000000000000
  %t49 = select i1 %t47, float %t48, float %t46
  %t50 = bitcast float %t49 to i32
  %t51 = lshr i32 %t50, 23
  %t52 = sub i32 %t51, 127
  %t53 = and i32 %t50, 8388607
  %t54 = or i32 %t53, 1065353216
  %t55 = bitcast i32 %t54 to float
  %t56 = fcmp ogt float %t55, 0x3FF6A09E60000000
  %t57 = fmul float %t55, 0.5
  %t58 = select i1 %t56, float %t57, float %t55
  %t59 = zext i1 %t56 to i32
  %t60 = add i32 %t52, %t59
  %t61 = sitofp i32 %t60 to float
  %t62 = select i1 %t47, float 23.0, float 0.0
  %t63 = fsub float %t61, %t62
  %t64 = fsub float %t58, 1.0
  %t65 = fadd float %t58, 1.0
  %t66 = fdiv float %t64, %t65
  %t67 = fmul float %t66, %t66
  %t68 = fmul contract float 0x3FD484B140000000, %t67
  %t69 = fadd contract float %t68, 0x3FDA617620000000
  %t70 = fmul contract float %t69, %t67
  %t71 = fadd contract float %t70, 0x3FE2776C60000000
  %t72 = fmul contract float %t71, %t67
  %t73 = fadd contract float %t72, 0x3FEEC709E0000000
  %t74 = fmul contract float %t73, %t67
  %t75 = fadd contract float %t74, 0x4007154760000000
  %t76 = fmul float %t75, %t66
  %t77 = fadd float %t63, %t76
  %t78 = fcmp oeq float %t46, 0.0
  %t79 = select i1 %t78, float 0xFFF0000000000000, float %t77
  %t80 = fcmp oeq float %t46, 0x7FF0000000000000
  %t81 = select i1 %t80, float %t46, float %t79
  %t82 = fcmp ult float %t46, 0.0
  %t83 = select i1 %t82, float 0x7FF8000000000000, float %t81
  %t84 = fmul contract float %t83, 0x3FE62E4300000000
  %t85 = getelementptr inbounds float, ptr %p0, i64 %r6
  store float %t84, ptr %t85
  %r6.n = add nuw nsw i64 %r6, 1
  store i64 %r6.n, ptr %r6.p
  br label %L6.cond, !llvm.loop !0
L6.exit:
  ret void
}

!0 = distinct !{!0, !1}
!1 = !{!"llvm.loop.mustprogress"}

