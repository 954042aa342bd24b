// ---- kernel 0
; kernel eqk (tiny)


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
  store float 0x0000000000000000, ptr %a3
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
  %t6 = fadd reassoc contract float %t5, %t4
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
  br label %L2.cond, !llvm.loop !6
L2.exit:
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

