// ---- kernel 0
; kernel eqk
declare float @llvm.maximum.f32(float, float)

define void @eqk(ptr noalias %p0, ptr noalias readonly %p1, i64 %lo, i64 %hi) nounwind {
entry:
  %a2 = alloca float
  %r3.p = alloca i64
  %r4.p = alloca i64
  store float 0xFFF0000000000000, ptr %a2
  store i64 0, ptr %r3.p
  br label %L3.cond
L3.cond:
  %r3 = load i64, ptr %r3.p
  %r3.c = icmp slt i64 %r3, 4
  br i1 %r3.c, label %L3.body, label %L3.exit
L3.body:
  store i64 0, ptr %r4.p
  br label %L4.cond
L4.cond:
  %r4 = load i64, ptr %r4.p
  %r4.c = icmp slt i64 %r4, 8
  br i1 %r4.c, label %L4.body, label %L4.exit
L4.body:
  %t1 = mul i64 %r3, 8
  %t2 = add i64 %t1, %r4
  %t3 = getelementptr inbounds float, ptr %p1, i64 %t2
  %t4 = load float, ptr %t3
  %t5 = load float, ptr %a2
  %t6 = call float @llvm.maximum.f32(float %t5, float %t4)
  store float %t6, ptr %a2
  %r4.n = add nuw nsw i64 %r4, 1
  store i64 %r4.n, ptr %r4.p
  br label %L4.cond, !llvm.loop !0
L4.exit:
  %r3.n = add nuw nsw i64 %r3, 1
  store i64 %r3.n, ptr %r3.p
  br label %L3.cond, !llvm.loop !4
L3.exit:
  %t7 = load float, ptr %a2
  %t8 = getelementptr inbounds float, ptr %p0, i64 0
  store float %t7, ptr %t8
  ret void
}

!0 = distinct !{!0, !1}
!1 = !{!"llvm.loop.mustprogress"}
!2 = !{!"llvm.loop.interleave.count", i32 4}
!3 = distinct !{!3, !1, !2}
!4 = distinct !{!4, !1, !5}
!5 = !{!"llvm.loop.unroll.disable"}

