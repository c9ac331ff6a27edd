"""From a sampler file and the job's JSON: steady rate, time to 90 % of it from the first generated
token, re-queue share. Steady rate: the engine counter's rate from 30 % to 80 % of the time the
counter moved (ramp and drain left out). Time to 90 %: the first moment the rate over the
preceding 2 s reaches 90 % of it. Usage: analyse.py SAMPLES.json JOB.json -> one JSON line"""

import json
import sys

s = json.load(open(sys.argv[1]))
job = json.load(open(sys.argv[2]))
rows = [(t, g) for t, g, _r, _w in s["rows"] if g is not None]
g0 = rows[0][1]
moving = [(t, g) for t, g in rows if g > g0]
out = {k: job.get(k) for k in ("status", "done", "requeued", "retries", "wall_s", "output_tokens_per_s")}
out["requeued_share"] = (job.get("requeued") or 0) / max(1, job.get("done") or 1)
if len(moving) > 10:
    ta, tb = moving[0][0], moving[-1][0]
    lo, hi = ta + 0.3 * (tb - ta), ta + 0.8 * (tb - ta)
    mid = [(t, g) for t, g in rows if lo <= t <= hi]
    steady = (mid[-1][1] - mid[0][1]) / (mid[-1][0] - mid[0][0])
    start = rows[[i for i, (t, g) in enumerate(rows) if g > g0][0] - 1][0]  # last sample before the first token
    t90 = None
    for i, (t, g) in enumerate(rows):
        back = [r for r in rows[:i] if r[0] <= t - 2.0]
        if back and t > start and (g - back[-1][1]) / (t - back[-1][0]) >= 0.9 * steady:
            t90 = round(t - start, 1)
            break
    out.update(steady_engine_tok_s=round(steady), t90_s=t90, engine_active_s=round(tb - start, 1))
out["events"] = [e for e in job.get("events", []) if "concurrency" in e or "taken out" in e][:14]
print(json.dumps(out))
