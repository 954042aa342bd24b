"""Command line: ``python -m eqgrad rules check [FILES]`` and ``python -m eqgrad rules stats``."""
from __future__ import annotations

import argparse
import sys


def _rules_check(args: argparse.Namespace) -> int:
    from .rules.check import check_rules
    from .rules.rulebook import RulebookError, all_rules, load_rulebook, validate
    try:
        if args.files:
            books = [load_rulebook(f) for f in args.files]
            validate(books)
            rules = [r for b in books for r in b.rules]
        else:
            rules = all_rules()
    except RulebookError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.rule:
        rules = [r for r in rules if r.name in args.rule]
    counts: dict[str, int] = {}

    def show(res) -> None:
        counts[res.status] = counts.get(res.status, 0) + 1
        if res.status != "sound" or args.verbose:
            print(res, flush=True)

    check_rules(rules, n=args.n, seed=args.seed, progress=show)
    print(f"{len(rules)} rules: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    bad = counts.get("unsound", 0) + (counts.get("untested", 0) if args.strict else 0)
    return 1 if bad else 0


def _rules_stats(args: argparse.Namespace) -> int:
    from .rules.rulebook import all_rules
    from .rules.stats import run_corpus
    st = run_corpus(include_examples=not args.no_examples,
                    progress=(lambda name: print(f"  ran {name}", file=sys.stderr)) if args.verbose else None)
    names = [r.name for r in all_rules() if not r.name.startswith("shape-")]
    print(st.report(names, top=args.top))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eqgrad", description="eqgrad tools")
    sub = p.add_subparsers(dest="cmd", required=True)
    rules = sub.add_parser("rules", help="rulebook tools").add_subparsers(dest="rcmd", required=True)
    c = rules.add_parser("check", help="check rules for soundness on random instances")
    c.add_argument("files", nargs="*", help="rulebook files (default: every active rulebook, generated included)")
    c.add_argument("--rule", action="append", help="only the rule(s) with this name")
    c.add_argument("-n", type=int, default=48, help="random instances per rule (default 48)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--strict", action="store_true", help="fail on rules no instance could exercise")
    c.add_argument("-v", "--verbose", action="store_true", help="print sound rules too")
    c.set_defaults(fn=_rules_check)
    s = rules.add_parser("stats", help="run the corpus and the examples; list dead and expensive rules")
    s.add_argument("--top", type=int, default=10)
    s.add_argument("--no-examples", action="store_true")
    s.add_argument("-v", "--verbose", action="store_true")
    s.set_defaults(fn=_rules_stats)
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
