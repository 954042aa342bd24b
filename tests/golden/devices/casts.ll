// ---- kernel 0
; kernel eqk (tiny)
declare i32 @llvm.fptosi.sat.i32.f32(float)

define void @eqk(ptr noalias %p0, ptr noalias readonly %p1, ptr noalias readonly %p2, ptr noalias readonly %p3, i64 %lo, i64 %hi) nounwind {
entry:
  %r4.p = alloca i64
  store i64 %lo, ptr %r4.p
  br label %L4.cond
L4.cond:
  %r4 = load i64, ptr %r4.p
  %r4.c = icmp slt i64 %r4, %hi
  br i1 %r4.c, label %L4.body, label %L4.exit
L4.body:
  %t1 = getelementptr inbounds float, ptr %p1, i64 %r4
  %t2 = load float, ptr %t1
  %t3 = call i32 @llvm.fptosi.sat.i32.f32(float %t2)
  %t4 = getelementptr inbounds float, ptr %p2, i64 %r4
  %t5 = load float, ptr %t4
  %t6 = fcmp olt float 0x0000000000000000, %t5
  %t7 = zext i1 %t6 to i32
  %t8 = add i32 %t3, %t7
  %t9 = getelementptr inbounds i32, ptr %p3, i64 %r4
  %t10 = load i32, ptr %t9
  %t11 = icmp sgt i32 %t8, %t10
  %t12 = select i1 %t11, i32 %t8, i32 %t10
  %t13 = getelementptr inbounds i32, ptr %p0, i64 %r4
  store i32 %t12, ptr %t13
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
!4 = distinct !{!4, !1, !5}
!5 = !{!"llvm.loop.unroll.disable"}

