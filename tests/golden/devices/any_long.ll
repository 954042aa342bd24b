// ---- kernel 0
; kernel eqk


define void @eqk(ptr noalias %p0, ptr noalias readonly %p1, ptr noalias readonly %p2, i64 %lo, i64 %hi) nounwind {
entry:
  %a3 = alloca i1
  %r4.p = alloca i64
  store i1 false, ptr %a3
  store i64 0, ptr %r4.p
  br label %L4.cond
L4.cond:
  %r4 = load i64, ptr %r4.p
  %r4.c = icmp slt i64 %r4, 512
  br i1 %r4.c, label %L4.body, label %L4.exit
L4.body:
  %t1 = getelementptr inbounds float, ptr %p1, i64 0
  %t2 = load float, ptr %t1
  %t3 = getelementptr inbounds float, ptr %p2, i64 %r4
  %t4 = load float, ptr %t3
  %t5 = fcmp olt float %t2, %t4
  %t6 = load i1, ptr %a3
  %t7 = or i1 %t6, %t5
  store i1 %t7, ptr %a3
  %r4.n = add nuw nsw i64 %r4, 1
  store i64 %r4.n, ptr %r4.p
  br label %L4.cond, !llvm.loop !0
L4.exit:
  %t8 = load i1, ptr %a3
  %t9 = getelementptr inbounds i8, ptr %p0, i64 0
  %t10 = zext i1 %t8 to i8
  store i8 %t10, ptr %t9
  ret void
}

!0 = distinct !{!0, !1}
!1 = !{!"llvm.loop.mustprogress"}
!2 = !{!"llvm.loop.interleave.count", i32 4}
!3 = distinct !{!3, !1, !2}
!4 = distinct !{!4, !1, !5}
!5 = !{!"llvm.loop.unroll.disable"}

