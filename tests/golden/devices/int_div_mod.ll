// ---- kernel 0
; kernel eqk (tiny)


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
  %t1 = getelementptr inbounds i32, ptr %p1, i64 %r4
  %t2 = load i32, ptr %t1
  %t3 = getelementptr inbounds i32, ptr %p2, i64 %r4
  %t4 = load i32, ptr %t3
  %t5 = icmp eq i32 %t4, 0
  %t6 = icmp eq i32 %t4, -1
  %t7 = or i1 %t5, %t6
  %t8 = select i1 %t7, i32 1, i32 %t4
  %t9 = sdiv i32 %t2, %t8
  %t10 = sub i32 0, %t2
  %t11 = select i1 %t6, i32 %t10, i32 %t9
  %t12 = select i1 %t5, i32 0, i32 %t11
  %t13 = icmp eq i32 %t4, 0
  %t14 = icmp eq i32 %t4, -1
  %t15 = or i1 %t13, %t14
  %t16 = select i1 %t15, i32 1, i32 %t4
  %t17 = srem i32 %t2, %t16
  %t18 = select i1 %t14, i32 0, i32 %t17
  %t19 = select i1 %t13, i32 0, i32 %t18
  %t20 = icmp eq i32 %t19, 0
  %t21 = xor i1 %t20, true
  %t22 = icmp slt i32 %t19, 0
  %t23 = icmp slt i32 %t4, 0
  %t24 = xor i1 %t22, %t23
  %t25 = and i1 %t21, %t24
  %t26 = zext i1 %t25 to i32
  %t27 = sub i32 0, %t26
  %t28 = add i32 %t12, %t27
  %t29 = getelementptr inbounds i32, ptr %p3, i64 %r4
  %t30 = load i32, ptr %t29
  %t31 = icmp eq i32 3, 0
  %t32 = icmp eq i32 3, -1
  %t33 = or i1 %t31, %t32
  %t34 = select i1 %t33, i32 1, i32 3
  %t35 = srem i32 %t30, %t34
  %t36 = select i1 %t32, i32 0, i32 %t35
  %t37 = select i1 %t31, i32 0, i32 %t36
  %t38 = icmp eq i32 %t37, 0
  %t39 = xor i1 %t38, true
  %t40 = icmp slt i32 %t37, 0
  %t41 = xor i1 %t40, false
  %t42 = and i1 %t39, %t41
  %t43 = select i1 %t42, i32 3, i32 0
  %t44 = add i32 %t37, %t43
  %t45 = add i32 %t28, %t44
  %t46 = getelementptr inbounds i32, ptr %p0, i64 %r4
  store i32 %t45, ptr %t46
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

