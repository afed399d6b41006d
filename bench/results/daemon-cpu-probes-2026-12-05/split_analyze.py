import json, statistics, sys
rows=[json.loads(l) for l in open("/tmp/gcprobe/probe.jsonl")]
rows=[r for r in rows if any(m[0]=="handler" for m in r)][5:]
print(len(rows), "requests")
# take first occurrence of each label, in order
seqs=[]
for r in rows:
    seen=[]; 
    for lab,t in r:
        if lab not in [s[0] for s in seen]: seen.append((lab,t))
    seqs.append(seen)
labels=[l for l,_ in seqs[0]]
print(labels)
prev=None
for i,l in enumerate(labels):
    if i==0: continue
    ds=[]
    for s in seqs:
        d=dict(s)
        if l in d and labels[i-1] in d: ds.append((d[l]-d[labels[i-1]])*1e6)
    print(f"{labels[i-1]:>16} -> {l:<16} median {statistics.median(ds):8.1f} us   (q1 {sorted(ds)[len(ds)//4]:.0f}, q3 {sorted(ds)[3*len(ds)//4]:.0f})")
tot=[(dict(s)["write"]-dict(s)["arrive"])*1e6 for s in seqs if "write" in dict(s)]
print("arrive->write median", statistics.median(tot))
