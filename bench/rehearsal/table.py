#!/usr/bin/python3
"""Prints the rehearsal benchmark's table (markdown) from the summary.json files that
bench/rehearsal/run.sh left in OUT, and checks the issue's targets against them."""
import json
import statistics
import sys
from pathlib import Path

# The targets (frontier.py and stream.py use them too). The runtime is judged by the
# machinery's overhead, not against incremental: a rehearsal step computes b + R samples
# where incremental's computes b, so its runtime over incremental's, divided by (b + R) / b,
# is what the draw, the insertion and the checkpoints add (docs/rehearsal.md).
MACHINERY_TARGET = 1.05   # (rehearsal runtime / incremental's) / ((b + R) / b)
WAIT_TARGET = 0.05        # time waiting for representatives / step time
ERROR_TARGET = 1.1        # ptycho-sim: first-scan error / scratch's (it governs the settings)
STREAM_COST_TARGET = 0.5  # the 10-scan ptycho-sim stream: rehearsal's cost / scratch's (stream.py)
SCRATCH_TARGET = 0.90     # Fashion-MNIST: scratch's final average accuracy (a strong baseline)
DERPP_TARGET = 0.85       # Fashion-MNIST: DER++ at 2,000's final average accuracy
DERPP_GAP = 5.0           # ... and at most this many points below scratch's


def load(out: Path) -> dict:
    runs = {}
    for f in sorted(out.glob("*/summary.json")):
        runs[f.parent.name] = json.loads(f.read_text())
    return runs


def load_pairs(out: Path) -> dict:
    """NAME -> [(its runtime, the runtime of its incremental neighbour, whether the two ran
    at the same time)]: OUT/NAME with OUT/pair/NAME first, then OUT/repeat/K/NAME with
    OUT/repeat/K/pair/NAME. run.sh marks a concurrent pair with OUT/pair/NAME.concurrent;
    otherwise the neighbour ran right before."""
    pairs = {}
    for d in [out] + sorted((out / "repeat").glob("*")):
        cells, neighbours = load(d), load(d / "pair")
        for name, s in cells.items():
            if name in neighbours:
                same_time = (d / "pair" / f"{name}.concurrent").exists()
                pairs.setdefault(name, []).append((s["runtime_s"], neighbours[name]["runtime_s"], same_time))
    return pairs


def ratio_of(name: str, s: dict, pairs: dict, inc: dict) -> tuple:
    """(runtime / incremental's, every ratio): the median over the job's pairs when it has
    any, else against the table's incremental row (None when there is none)."""
    if name in pairs:
        ratios = [r / b for r, b, _ in pairs[name]]
        return statistics.median(ratios), ratios
    base = inc.get((s["dataset"], s["world_size"]))
    return (s["runtime_s"] / base["runtime_s"], []) if base else (None, [])


def shape(s: dict) -> str:
    """Per rank and step: stream samples + representatives, then epochs, then the weights'
    moving average when one was evaluated ('?' for a summary written before these fields
    existed)."""
    if "batch_size" not in s:
        return "?"
    reps = f" + {s['representatives']}" if s.get("representatives") else ""
    ema = f", ema {s['ema']}" if s.get("ema") else ""
    return f"{s['batch_size']}{reps}, {s['epochs']}{ema}"


def report(out: Path, verdicts: dict) -> bool:
    """Prints OUT's table and its targets; each target's verdict (True: met) is appended to
    verdicts[its name]. False when OUT has no summary."""
    runs = load(out)
    pairs = load_pairs(out)
    if not runs:
        print(f"no summary.json under {out}")
        return False

    def judged(name: str, ok: bool) -> str:
        verdicts.setdefault(name, []).append(ok)
        return "met" if ok else "NOT met"
    order = {"scratch": 0, "incremental": 1, "er": 2, "der": 3, "derpp": 4}
    rows = sorted(runs.items(), key=lambda kv: (kv[1]["dataset"], kv[1]["world_size"], order[kv[1]["strategy"]],
                                                 kv[1]["buffer_size"]))
    inc = {(s["dataset"], s["world_size"]): s for _, s in rows if s["strategy"] == "incremental"}
    print("| dataset | ranks | strategy | buffer | b + R, epochs | final average | first task at the end | runtime s | "
          "incremental neighbour s | x incremental | machinery overhead | waiting for representatives | seed |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, s in rows:
        cls = "average_accuracy" in s
        avg = s["average_accuracy"] if cls else s["average_error"]
        r, all_r = ratio_of(name, s, pairs, inc)
        ratio = f"{r:.2f}" if r is not None else "-"
        if len(all_r) > 1:
            ratio += " (median of " + ", ".join(f"{x:.2f}" for x in all_r) + ")"
        machinery = "-"
        if r is not None and s.get("representatives") and s.get("batch_size"):
            machinery = f"{r / ((s['batch_size'] + s['representatives']) / s['batch_size']):.2f}"
        before = "-"
        if name in pairs:
            _, b, same_time = pairs[name][0]
            before = f"{b:.1f}, {'same time' if same_time else 'before'}"
        fmt = (lambda v: f"{100 * v:.1f} %") if cls else (lambda v: f"{v:.3g}")
        print(f"| {s['dataset']} | {s['world_size']} | {s['strategy']} | {s['buffer_size'] or '-'} | {shape(s)} | "
              f"{fmt(avg)} {'acc' if cls else 'err'} | {fmt(s['first_task_final'])} | {s['runtime_s']:.1f} | {before} | {ratio} | {machinery} | "
              f"{100 * s['wait_fraction']:.2f} % | {s['seed']} |")

    print()
    print("targets (measured above):")
    def get(ds, w, strat, buf=0):
        for _, s in rows:
            if (s["dataset"], s["world_size"], s["strategy"], s["buffer_size"]) == (ds, w, strat, buf):
                return s
        return None

    def runtime_and_wait(ds, w):
        """The machinery and waiting targets over the rehearsal cells of (dataset, ranks); None
        without any. Needs that block's incremental job (the fallback of ratio_of)."""
        where = f"{ds}, {w} rank(s)"
        reh = [(n, s) for n, s in rows if s["dataset"] == ds and s["world_size"] == w and s["buffer_size"]]
        if not reh:
            return None
        machinery = max(ratio_of(n, s, pairs, inc)[0] / ((s["batch_size"] + s["representatives"]) / s["batch_size"])
                        for n, s in reh)
        wait = max(s["wait_fraction"] for _, s in reh)
        return (f"machinery overhead (runtime x incremental over (b + R) / b) <= {machinery:.2f} "
                f"(target {MACHINERY_TARGET}: {judged(where + ': machinery', machinery <= MACHINERY_TARGET)}); "
                f"waiting <= {100 * wait:.2f} % of step time "
                f"(target {100 * WAIT_TARGET:.0f} %: {judged(where + ': waiting', wait <= WAIT_TARGET)})")

    for w in (1, 2):
        sc, ic = get("fashion-mnist", w, "scratch"), get("fashion-mnist", w, "incremental")
        if not sc or not ic:
            continue
        print(f"- {w} rank(s): incremental {100 * ic['average_accuracy']:.1f} % vs scratch "
              f"{100 * sc['average_accuracy']:.1f} % (forgetting: first task {100 * ic['first_task_final']:.1f} % at the end); "
              f"scratch >= {100 * SCRATCH_TARGET:.0f} %: "
              f"{judged(f'fashion-mnist, {w} rank(s): scratch', sc['average_accuracy'] >= SCRATCH_TARGET)}")
        dpp = get("fashion-mnist", w, "derpp", 2000)
        if dpp:
            gap = 100 * (sc["average_accuracy"] - dpp["average_accuracy"])
            ok = gap <= DERPP_GAP and dpp["average_accuracy"] >= DERPP_TARGET
            print(f"  DER++ at 2000: {100 * dpp['average_accuracy']:.1f} %, {gap:.1f} points below scratch "
                  f"(target >= {100 * DERPP_TARGET:.0f} % and <= {DERPP_GAP:.0f} points): "
                  f"{judged(f'fashion-mnist, {w} rank(s): DER++ at 2000', ok)}")
        dpp2, er2 = get("fashion-mnist", w, "derpp", 200), get("fashion-mnist", w, "er", 200)
        if dpp2 and er2:
            ok = dpp2["average_accuracy"] > er2["average_accuracy"]
            print(f"  at 200: DER++ {100 * dpp2['average_accuracy']:.1f} % vs ER {100 * er2['average_accuracy']:.1f} %: "
                  f"{judged(f'fashion-mnist, {w} rank(s): DER++ above ER at 200', ok)}")
        line = runtime_and_wait("fashion-mnist", w)
        if line:
            print(f"  {line}")
    for w in (1, 2):
        sc, ic = get("ptycho-sim", w, "scratch"), get("ptycho-sim", w, "incremental")
        if sc:
            e0 = sc["first_task_final"]
            for _, s in rows:
                if s["dataset"] == "ptycho-sim" and s["world_size"] == w and s["strategy"] != "scratch":
                    r = s["first_task_final"] / e0
                    target = ""
                    if s["buffer_size"]:
                        met = judged(f"ptycho-sim, {w} rank(s): {s['strategy']} at {s['buffer_size']} first-scan error",
                                     r <= ERROR_TARGET)
                        target = f" (target <= {ERROR_TARGET:.2f}: {met})"
                    print(f"- ptycho, {w} rank(s), {s['strategy']} at {s['buffer_size'] or '-'}: first-scan error "
                          f"{s['first_task_final']:.3g} = {r:.2f} x scratch's {e0:.3g}{target}")
        line = runtime_and_wait("ptycho-sim", w) if ic else None
        if line:
            print(f"- ptycho, {w} rank(s): {line}")
    return True


def main() -> int:
    """table.py [OUT ...] [--stream STREAM_OUT]: one table and its targets per OUT (run.sh's,
    one seed each), then, with several, how many of them meet each target; with --stream,
    also the 10-scan stream's table and targets (stream.sh's OUT, as stream.py prints them)."""
    args = sys.argv[1:]
    stream_out = None
    if "--stream" in args:
        i = args.index("--stream")
        if i + 1 >= len(args):
            print("--stream needs the directory stream.sh wrote (its OUT)")
            return 2
        stream_out = Path(args[i + 1])
        del args[i:i + 2]
    if stream_out is not None and not args:
        from stream import report as stream_report  # bench/rehearsal/stream.py
        return stream_report(stream_out)
    outs = [Path(a) for a in args] or [Path("/tmp/diaspora-bench-rehearsal")]
    verdicts: dict = {}
    for i, out in enumerate(outs):
        if len(outs) > 1:
            print(f"{'' if i == 0 else chr(10)}## {out}")
        if not report(out, verdicts):
            return 1
    if len(outs) > 1:
        print()
        print(f"targets over the {len(outs)} runs:")
        for name, oks in verdicts.items():
            print(f"- {name}: met in {sum(oks)} of {len(oks)}{'' if all(oks) else ' (NOT met on every run)'}")
    if stream_out is not None:
        from stream import report as stream_report  # bench/rehearsal/stream.py
        print(f"\n## the 10-scan ptycho-sim stream ({stream_out})")
        return stream_report(stream_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
