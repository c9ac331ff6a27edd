"""Sample a server's /metrics every 0.5 s: (seconds since start, generation tokens, running, waiting),
until STOP_FILE exists. The engine's own counter, so time-to-90 % is not blurred by non-streamed
answers arriving in lumps. Usage: sampler.py URL OUT.json STOP_FILE"""

import json
import os
import sys
import time
import urllib.request

url, out, stop = sys.argv[1], sys.argv[2], sys.argv[3]
names = {"vllm:generation_tokens_total": 1, "vllm:num_requests_running": 2, "vllm:num_requests_waiting": 3}
rows, t0 = [], time.monotonic()
while not os.path.exists(stop):
    vals = [round(time.monotonic() - t0, 3), None, None, None]
    try:
        text = urllib.request.urlopen(url + "/metrics", timeout=2).read().decode()
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            name = line.split("{")[0].split(" ")[0]
            if name in names:
                i = names[name]
                vals[i] = (vals[i] or 0.0) + float(line.rsplit(" ", 1)[1])
    except Exception:
        pass
    rows.append(vals)
    time.sleep(0.5)
json.dump({"columns": ["t", "generation_tokens", "running", "waiting"], "rows": rows}, open(out, "w"))
