// ---- kernel 0
; kernel eqk (tiny)
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
  %t47 = fcmp olt float 0x0000000000000000, %t44
  %t48 = fcmp oeq float %t44, 0x0000000000000000
  %t49 = select i1 %t48, float 0x0000000000000000, float %t44
  %t50 = select i1 %t47, float %t44, float %t49
  %t51 = select i1 %t45, float %t46, float %t50
  %t52 = fadd contract float %t42, %t51
  %t53 = fcmp olt float %t52, 0x3810000000000000
  %t54 = fmul contract float %t52, 0x4160000000000000
  %t55 = select i1 %t53, float %t54, float %t52
  %t56 = bitcast float %t55 to i32
  %t57 = lshr i32 %t56, 23
  %t58 = add i32 %t57, -127
  %t59 = and i32 %t56, 8388607
  %t60 = or i32 %t59, 1065353216
  %t61 = bitcast i32 %t60 to float
  %t62 = fcmp olt float 0x3FF6A09E60000000, %t61
  %t63 = fmul contract float %t61, 0x3FE0000000000000
  %t64 = select i1 %t62, float %t63, float %t61
  %t65 = zext i1 %t62 to i32
  %t66 = add i32 %t58, %t65
  %t67 = sitofp i32 %t66 to float
  %t68 = select i1 %t53, float 0xC037000000000000, float 0x0000000000000000
  %t69 = fadd contract float %t67, %t68
  %t70 = fadd contract float %t64, 0xBFF0000000000000
  %t71 = fmul contract float 0x3FBFE1CA00000000, %t70
  %t72 = fadd contract float %t71, 0xBFCA3710A0000000
  %t73 = fmul contract float %t72, %t70
  %t74 = fadd contract float %t73, 0x3FCB87FBE0000000
  %t75 = fmul contract float %t74, %t70
  %t76 = fadd contract float %t75, 0xBFCE9F9A60000000
  %t77 = fmul contract float %t76, %t70
  %t78 = fadd contract float %t77, 0x3FD26EAD60000000
  %t79 = fmul contract float %t78, %t70
  %t80 = fadd contract float %t79, 0xBFD7159960000000
  %t81 = fmul contract float %t80, %t70
  %t82 = fadd contract float %t81, 0x3FDEC73220000000
  %t83 = fmul contract float %t82, %t70
  %t84 = fadd contract float %t83, 0xBFE7154740000000
  %t85 = fmul contract float %t84, %t70
  %t86 = fadd contract float %t85, 0x3FF7154760000000
  %t87 = fmul contract float %t86, %t70
  %t88 = fadd contract float %t87, %t69
  %t89 = fcmp oeq float %t52, 0x0000000000000000
  %t90 = select i1 %t89, float 0xFFF0000000000000, float %t88
  %t91 = fcmp oeq float %t52, 0x7FF0000000000000
  %t92 = select i1 %t91, float %t52, float %t90
  %t93 = fcmp olt float %t52, 0x0000000000000000
  %t94 = fcmp oeq float %t52, %t52
  %t95 = xor i1 %t94, true
  %t96 = or i1 %t93, %t95
  %t97 = select i1 %t96, float 0x7FF8000000000000, float %t92
  %t98 = getelementptr inbounds float, ptr %p8, i64 0
  %t99 = load float, ptr %t98
  %t100 = fmul contract float %t97, %t99
  %t101 = getelementptr inbounds float, ptr %p0, i64 %r9
  store float %t100, ptr %t101
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

