#!/usr/bin/env python3
# Per-stage times of small downloads from a trace dumped by a build with 5-trace-timeline.patch:
#   python3 bench/experiments/issue35/5-stages.py TRACE.txt
# Stages are matched by the trace notes; medians, means and 90th percentiles in ms over the files f00000.bin...
import re, collections, statistics, sys
ev=collections.defaultdict(dict)
for line in open(sys.argv[1]):
    m=re.match(r'([\d.]+) \[\d+\] \S+/(f\d{5})\.bin (.*)', line)
    if not m: continue
    t,f,rest=float(m.group(1)),m.group(2),m.group(3)
    key=None
    for k in ['run start','attempt start','loop add','loop head','attempt head','attempt decide start','attempt decide end','attempt decision','loop body','body first','loop finish','run action finish','finish start','finish pool','finish renamed','finish synced']:
        if rest.startswith(k): key=k; break
    if key and key not in ev[f]: ev[f][key]=t
order=['run start','attempt start','loop add','loop head','attempt head','attempt decide start','attempt decide end','attempt decision','loop body','body first','loop finish','run action finish','finish start','finish pool','finish renamed','finish synced']
tot=0
for a,b in zip(order,order[1:]):
    d=sorted((e[b]-e[a])*1000 for e in ev.values() if a in e and b in e)
    if not d: continue
    tot+=statistics.mean(d)
    print(f"{a:>22} -> {b:<22} n={len(d)} median {statistics.median(d):6.3f} ms  mean {statistics.mean(d):6.3f}  p90 {d[int(len(d)*.9)]:6.3f}")
starts=sorted(e['run start'] for e in ev.values() if 'run start' in e)
print("run starts span %.3f s; slot (run start->loop finish) mean %.3f ms" % (starts[-1]-starts[0], statistics.mean((e['loop finish']-e['run start'])*1000 for e in ev.values() if 'loop finish' in e and 'run start' in e)))
