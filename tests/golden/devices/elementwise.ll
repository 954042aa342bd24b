// ---- kernel 0
; kernel eqk
declare float @llvm.floor.f32(float)

define void @eqk(ptr noalias %p0, ptr noalias readonly %p1, ptr noalias readonly %p2, ptr noalias readonly %p3, ptr noalias readonly %p4, ptr noalias readonly %p5, ptr noalias readonly %p6, ptr noalias readonly %p7, ptr noalias readonly %p8, i64 %lo, i64 %hi) nounwind {
entry:
  %r9.p = alloca i64
  store i64 %lo, ptr %r9.p
  br label %L9.cond
L9.cond:
  %r9 = load i64, ptr %r9.p
  %r9.c = icmp slt i64 %r9, %hi
  br i1 %r9.c, label %L9.body, label %L9.exit
L9.body:
  %t1 = getelementptr inbounds float, ptr %p1, i64 %r9
  %t2 = load float, ptr %t1
  %t3 = getelementptr inbounds float, ptr %p2, i64 %r9
  %t4 = load float, ptr %t3
  %t5 = fmul contract float %t2, %t4
  %t6 = getelementptr inbounds float, ptr %p3, i64 %r9
  %t7 = load float, ptr %t6
  %t8 = fadd contract float %t5, %t7
  %t9 = getelementptr inbounds float, ptr %p4, i64 0
  %t10 = load float, ptr %t9
  %t11 = fmul contract float %t8, %t10
  %t12 = getelementptr inbounds float, ptr %p5, i64 %r9
  %t13 = load float, ptr %t12
  %t14 = fneg float %t13
  %t15 = fadd contract float %t11, %t14
  %t16 = getelementptr inbounds float, ptr %p6, i64 0
  %t17 = load float, ptr %t16
  %t18 = fmul contract float %t15, %t17
  %t19 = fcmp olt float 0x4060000000000000, %t18
  %t20 = select i1 %t19, float 0x4060000000000000, float %t18
  %t21 = fcmp olt float %t20, 0xC05FC00000000000
  %t22 = select i1 %t21, float 0xC05FC00000000000, float %t20
  %t23 = call float @llvm.floor.f32(float %t22)
  %t24 = fneg float %t23
  %t25 = fadd contract float %t22, %t24
  %t26 = fmul contract float 0x3F2C6E2920000000, %t25
  %t27 = fadd contract float %t26, 0x3F546301C0000000
  %t28 = fmul contract float %t27, %t25
  %t29 = fadd contract float %t28, 0x3F83D24EA0000000
  %t30 = fmul contract float %t29, %t25
  %t31 = fadd contract float %t30, 0x3FAC685620000000
  %t32 = fmul contract float %t31, %t25
  %t33 = fadd contract float %t32, 0x3FCEBFD9A0000000
  %t34 = fmul contract float %t33, %t25
  %t35 = fadd contract float %t34, 0x3FE62E42A0000000
  %t36 = fmul contract float %t35, %t25
  %t37 = fadd contract float %t36, 0x3FF0000000000000
  %t38 = fadd contract float %t23, 0x4168000FE0000000
  %t39 = bitcast float %t38 to i32
  %t40 = shl i32 %t39, 23
  %t41 = bitcast i32 %t40 to float
  %t42 = fmul contract float %t37, %t41
  %t43 = getelementptr inbounds float, ptr %p7, i64 %r9
  %t44 = load float, ptr %t43
  %t45 = fcmp olt float %t44, 0x0000000000000000
  %t46 = fneg float %t44
  %t47 = select i1 %t45, float %t46, float %t44
  %t48 = fadd contract float %t42, %t47
  %t49 = fcmp olt float %t48, 0x3810000000000000
  %t50 = fmul contract float %t48, 0x4160000000000000
  %t51 = select i1 %t49, float %t50, float %t48
  %t52 = bitcast float %t51 to i32
  %t53 = lshr i32 %t52, 23
  %t54 = add i32 %t53, -127
  %t55 = and i32 %t52, 8388607
  %t56 = or i32 %t55, 1065353216
  %t57 = bitcast i32 %t56 to float
  %t58 = fcmp olt float 0x3FF6A09E60000000, %t57
  %t59 = fmul contract float %t57, 0x3FE0000000000000
  %t60 = select i1 %t58, float %t59, float %t57
  %t61 = zext i1 %t58 to i32
  %t62 = add i32 %t54, %t61
  %t63 = sitofp i32 %t62 to float
  %t64 = select i1 %t49, float 0xC037000000000000, float 0x0000000000000000
  %t65 = fadd contract float %t63, %t64
  %t66 = fadd contract float %t60, 0xBFF0000000000000
  %t67 = fmul contract float 0x3FBFE1CA00000000, %t66
  %t68 = fadd contract float %t67, 0xBFCA3710A0000000
  %t69 = fmul contract float %t68, %t66
  %t70 = fadd contract float %t69, 0x3FCB87FBE0000000
  %t71 = fmul contract float %t70, %t66
  %t72 = fadd contract float %t71, 0xBFCE9F9A60000000
  %t73 = fmul contract float %t72, %t66
  %t74 = fadd contract float %t73, 0x3FD26EAD60000000
  %t75 = fmul contract float %t74, %t66
  %t76 = fadd contract float %t75, 0xBFD7159960000000
  %t77 = fmul contract float %t76, %t66
  %t78 = fadd contract float %t77, 0x3FDEC73220000000
  %t79 = fmul contract float %t78, %t66
  %t80 = fadd contract float %t79, 0xBFE7154740000000
  %t81 = fmul contract float %t80, %t66
  %t82 = fadd contract float %t81, 0x3FF7154760000000
  %t83 = fmul contract float %t82, %t66
  %t84 = fadd contract float %t83, %t65
  %t85 = fcmp oeq float %t48, 0x0000000000000000
  %t86 = select i1 %t85, float 0xFFF0000000000000, float %t84
  %t87 = fcmp oeq float %t48, 0x7FF0000000000000
  %t88 = select i1 %t87, float %t48, float %t86
  %t89 = fcmp olt float %t48, 0x0000000000000000
  %t90 = fcmp oeq float %t48, %t48
  %t91 = xor i1 %t90, true
  %t92 = or i1 %t89, %t91
  %t93 = select i1 %t92, float 0x7FF8000000000000, float %t88
  %t94 = getelementptr inbounds float, ptr %p8, i64 0
  %t95 = load float, ptr %t94
  %t96 = fmul contract float %t93, %t95
  %t97 = getelementptr inbounds float, ptr %p0, i64 %r9
  store float %t96, ptr %t97
  %r9.n = add nuw nsw i64 %r9, 1
  store i64 %r9.n, ptr %r9.p
  br label %L9.cond, !llvm.loop !0
L9.exit:
  ret void
}

!0 = distinct !{!0, !1}
!1 = !{!"llvm.loop.mustprogress"}
!2 = !{!"llvm.loop.interleave.count", i32 4}
!3 = distinct !{!3, !1, !2}
!4 = distinct !{!4, !1, !5}
!5 = !{!"llvm.loop.unroll.disable"}

