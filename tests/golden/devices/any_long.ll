// ---- kernel 0
; kernel eqk


define void @eqk(ptr noalias %p0, ptr noalias readonly %p1, i64 %lo, i64 %hi) nounwind {
entry:
  %a2 = alloca i1
  %r3.p = alloca i64
  store i1 false, ptr %a2
  store i64 0, ptr %r3.p
  br label %L3.cond
L3.cond:
  %r3 = load i64, ptr %r3.p
  %r3.c = icmp slt i64 %r3, 512
  br i1 %r3.c, label %L3.body, label %L3.exit
L3.body:
  %t1 = getelementptr inbounds float, ptr %p1, i64 %r3
  %t2 = load float, ptr %t1
  %t3 = fcmp olt float 0x4004000000000000, %t2
  %t4 = load i1, ptr %a2
  %t5 = or i1 %t4, %t3
  store i1 %t5, ptr %a2
  %r3.n = add nuw nsw i64 %r3, 1
  store i64 %r3.n, ptr %r3.p
  br label %L3.cond, !llvm.loop !0
L3.exit:
  %t6 = load i1, ptr %a2
  %t7 = getelementptr inbounds i8, ptr %p0, i64 0
  %t8 = zext i1 %t6 to i8
  store i8 %t8, ptr %t7
  ret void
}

!0 = distinct !{!0, !1}
!1 = !{!"llvm.loop.mustprogress"}
!2 = !{!"llvm.loop.interleave.count", i32 4}
!3 = distinct !{!3, !1, !2}

