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
  %t33 = fadd float %t19, 0x4168000FE0000000
  %t34 = bitcast float %t33 to i32
  %t35 = shl i32 %t34, 23
  %t36 = bitcast i32 %t35 to float
  %t37 = fmul float %t32, %t36
  %t38 = getelementptr inbounds float, ptr %p5, i64 %r6
  %t39 = load float, ptr %t38
  %t40 = fcmp olt float %t39, 0x0000000000000000
  %t41 = fneg float %t39
  %t42 = select i1 %t40, float %t41, float %t39
  %t43 = fadd contract float %t37, %t42
  %t44 = fcmp olt float %t43, 0x3810000000000000
  %t45 = fmul float %t43, 0x4160000000000000
  %t46 = select i1 %t44, float %t45, float %t43
  %t47 = bitcast float %t46 to i32
  %t48 = lshr i32 %t47, 23
  %t49 = sub i32 %t48, 127
  %t50 = and i32 %t47, 8388607
  %t51 = or i32 %t50, 1065353216
  %t52 = bitcast i32 %t51 to float
  %t53 = fcmp ogt float %t52, 0x3FF6A09E60000000
  %t54 = fmul float %t52, 0.5
  %t55 = select i1 %t53, float %t54, float %t52
  %t56 = zext i1 %t53 to i32
  %t57 = add i32 %t49, %t56
  %t58 = sitofp i32 %t57 to float
  %t59 = select i1 %t44, float 23.0, float 0.0
  %t60 = fsub float %t58, %t59
  %t61 = fsub float %t55, 1.0
  %t62 = fmul contract float 0x3FBFE1CA00000000, %t61
  %t63 = fadd contract float %t62, 0xBFCA3710A0000000
  %t64 = fmul contract float %t63, %t61
  %t65 = fadd contract float %t64, 0x3FCB87FBE0000000
  %t66 = fmul contract float %t65, %t61
  %t67 = fadd contract float %t66, 0xBFCE9F9A60000000
  %t68 = fmul contract float %t67, %t61
  %t69 = fadd contract float %t68, 0x3FD26EAD60000000
  %t70 = fmul contract float %t69, %t61
  %t71 = fadd contract float %t70, 0xBFD7159960000000
  %t72 = fmul contract float %t71, %t61
  %t73 = fadd contract float %t72, 0x3FDEC73220000000
  %t74 = fmul contract float %t73, %t61
  %t75 = fadd contract float %t74, 0xBFE7154740000000
  %t76 = fmul contract float %t75, %t61
  %t77 = fadd contract float %t76, 0x3FF7154760000000
  %t78 = fmul contract float %t77, %t61
  %t79 = fadd contract float %t60, %t78
  %t80 = fcmp oeq float %t43, 0.0
  %t81 = select i1 %t80, float 0xFFF0000000000000, float %t79
  %t82 = fcmp oeq float %t43, 0x7FF0000000000000
  %t83 = select i1 %t82, float %t43, float %t81
  %t84 = fcmp ult float %t43, 0.0
  %t85 = select i1 %t84, float 0x7FF8000000000000, float %t83
  %t86 = fmul contract float %t85, 0x3FE62E4300000000
  %t87 = getelementptr inbounds float, ptr %p0, i64 %r6
  store float %t86, ptr %t87
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

