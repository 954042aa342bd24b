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
  %t39 = getelementptr inbounds float, ptr %p5, i64 %r6
  %t40 = load float, ptr %t39
  %t41 = fcmp olt float %t40, 0x0000000000000000
  %t42 = fneg float %t40
  %t43 = select i1 %t41, float %t42, float %t40
  %t44 = fadd contract float %t38, %t43
  %t45 = fcmp olt float %t44, 0x3810000000000000
  %t46 = fmul contract float %t44, 0x4160000000000000
  %t47 = select i1 %t45, float %t46, float %t44
  %t48 = bitcast float %t47 to i32
  %t49 = lshr i32 %t48, 23
  %t50 = add i32 %t49, -127
  %t51 = and i32 %t48, 8388607
  %t52 = or i32 %t51, 1065353216
  %t53 = bitcast i32 %t52 to float
  %t54 = fcmp olt float 0x3FF6A09E60000000, %t53
  %t55 = fmul contract float %t53, 0x3FE0000000000000
  %t56 = select i1 %t54, float %t55, float %t53
  %t57 = zext i1 %t54 to i32
  %t58 = add i32 %t50, %t57
  %t59 = sitofp i32 %t58 to float
  %t60 = select i1 %t45, float 0xC037000000000000, float 0x0000000000000000
  %t61 = fadd contract float %t59, %t60
  %t62 = fadd contract float %t56, 0xBFF0000000000000
  %t63 = fmul contract float 0x3FBFE1CA00000000, %t62
  %t64 = fadd contract float %t63, 0xBFCA3710A0000000
  %t65 = fmul contract float %t64, %t62
  %t66 = fadd contract float %t65, 0x3FCB87FBE0000000
  %t67 = fmul contract float %t66, %t62
  %t68 = fadd contract float %t67, 0xBFCE9F9A60000000
  %t69 = fmul contract float %t68, %t62
  %t70 = fadd contract float %t69, 0x3FD26EAD60000000
  %t71 = fmul contract float %t70, %t62
  %t72 = fadd contract float %t71, 0xBFD7159960000000
  %t73 = fmul contract float %t72, %t62
  %t74 = fadd contract float %t73, 0x3FDEC73220000000
  %t75 = fmul contract float %t74, %t62
  %t76 = fadd contract float %t75, 0xBFE7154740000000
  %t77 = fmul contract float %t76, %t62
  %t78 = fadd contract float %t77, 0x3FF7154760000000
  %t79 = fmul contract float %t78, %t62
  %t80 = fadd contract float %t79, %t61
  %t81 = fcmp oeq float %t44, 0x0000000000000000
  %t82 = select i1 %t81, float 0xFFF0000000000000, float %t80
  %t83 = fcmp oeq float %t44, 0x7FF0000000000000
  %t84 = select i1 %t83, float %t44, float %t82
  %t85 = fcmp olt float %t44, 0x0000000000000000
  %t86 = fcmp oeq float %t44, %t44
  %t87 = xor i1 %t86, true
  %t88 = or i1 %t85, %t87
  %t89 = select i1 %t88, float 0x7FF8000000000000, float %t84
  %t90 = fmul contract float %t89, 0x3FE62E4300000000
  %t91 = getelementptr inbounds float, ptr %p0, i64 %r6
  store float %t90, ptr %t91
  %r6.n = add nuw nsw i64 %r6, 1
  store i64 %r6.n, ptr %r6.p
  br label %L6.cond, !llvm.loop !0
L6.exit:
  ret void
}

!0 = distinct !{!0, !1}
!1 = !{!"llvm.loop.mustprogress"}
!2 = !{!"llvm.loop.interleave.count", i32 4}
!3 = distinct !{!3, !1, !2}

