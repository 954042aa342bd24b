// ---- kernel 0
; kernel eqk (tiny)


define void @eqk(ptr noalias %p0, ptr noalias readonly %p1, i64 %lo, i64 %hi) nounwind {
entry:
  %r2.p = alloca i64
  %r3.p = alloca i64
  store i64 %lo, ptr %r2.p
  br label %L2.cond
L2.cond:
  %r2 = load i64, ptr %r2.p
  %r2.c = icmp slt i64 %r2, %hi
  br i1 %r2.c, label %L2.body, label %L2.exit
L2.body:
  store i64 0, ptr %r3.p
  br label %L3.cond
L3.cond:
  %r3 = load i64, ptr %r3.p
  %r3.c = icmp slt i64 %r3, 6
  br i1 %r3.c, label %L3.body, label %L3.exit
L3.body:
  %t1 = add i64 %r2, -1
  %t2 = icmp slt i64 -1, %t1
  %t3 = mul i64 %r3, -1
  %t4 = add i64 %t3, 5
  %t5 = icmp slt i64 %t4, 4
  %t6 = and i1 %t2, %t5
  %t7 = mul i64 %r2, 4
  %t8 = add i64 %t7, %t3
  %t9 = add i64 %t8, 1
  %t10 = select i1 %t6, i64 %t9, i64 0
  %t11 = getelementptr float, ptr %p1, i64 %t9
  br label %G20.pre
G20.pre:
  br i1 %t6, label %G20.ld, label %G20.join
G20.ld:
  %t12 = load float, ptr %t11
  br label %G20.join
G20.join:
  %t13 = phi float [ %t12, %G20.ld ], [ zeroinitializer, %G20.pre ]
  %t14 = select i1 %t6, float %t13, float 0x0000000000000000
  %t15 = fcmp olt float 0x0000000000000000, %t14
  %t16 = select i1 %t15, float %t14, float 0x0000000000000000
  %t17 = mul i64 %r2, 6
  %t18 = add i64 %t17, %r3
  %t19 = getelementptr inbounds float, ptr %p0, i64 %t18
  store float %t16, ptr %t19
  %r3.n = add nuw nsw i64 %r3, 1
  store i64 %r3.n, ptr %r3.p
  br label %L3.cond, !llvm.loop !0
L3.exit:
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

