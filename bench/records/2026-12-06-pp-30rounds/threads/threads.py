"""Per-thread CPU ticks of processes whose cmdline contains PATTERN, sampled for SECS (totals)."""
import os, sys, time
pat, secs, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
first, last, names = {}, {}, {}
t0 = time.time()
while time.time() - t0 < secs:
    for p in os.listdir("/proc"):
        if not p.isdigit(): continue
        try:
            cmd = open(f"/proc/{p}/cmdline").read().replace("\0", " ")
            if pat not in cmd or "threads.py" in cmd: continue
            for t in os.listdir(f"/proc/{p}/task"):
                s = open(f"/proc/{p}/task/{t}/stat").read()
                name = s[s.index("(")+1:s.rindex(")")]
                f = s[s.rindex(")")+2:].split()
                st = open(f"/proc/{p}/task/{t}/status").read()
                vcs = int(st.split("voluntary_ctxt_switches:")[1].split()[0])
                v = (int(f[11]) + int(f[12]), vcs); k = (p, t)
                first.setdefault(k, v); last[k] = v; names[k] = name
        except Exception: pass
    time.sleep(0.05)
rows = sorted(((last[k][0] - first[k][0], last[k][1] - first[k][1], k, names[k]) for k in last), reverse=True)
open(out, "w").write("\n".join(f"{d} ticks {w} wakes {k[0]}/{k[1]} {n}" for d, w, k, n in rows if d > 0 or w > 0) + "\n")
