#!/usr/bin/env python3
"""Model of run_bands' schedule (src/model/deepseek/cuda/moe_decode_v9.cu, variants 17..24), checked on the CPU.

Mirrors its load cursor (chunk pairs or single chunks, the band jump after a band's last load),
compute order, band stores and L2 prefetch cursor in abstract units (band = BAND, chunk = 1) and
asserts, for every band count / chunk count / prefetch distance used: the MMAs see the chunks of
band 0, 1, ... in order (so each band sums exactly as v13 / v9), each band is stored once after its
last chunk, and every chunk pair's line is prefetched exactly once. Keep in step with the kernel.
"""
# simulate run_bands' load/compute/prefetch schedule (pointer arithmetic in units: band offset B, chunk offset)
def sim(nf, nb, kPf, pairs):
    n_all = nb*nf
    BAND = 10**6  # bytes per band in "row units" (abstract)
    KW = 1        # one chunk unit per chunk
    P = 0         # pointer position in abstract units: band*BAND + chunk
    slots = {}
    lc = 0
    loads = []
    computes = []
    stores = []
    pf = []
    pc, pb = kPf % nf, kPf // nf
    pw = pb*BAND + pc
    def prefetch_pair():
        nonlocal pc, pb, pw
        if pb < nb: pf.append(pw)
        pw += 2; pc += 2
        if pc == nf:
            pc = 0; pb += 1; pw += BAND - nf
    init_pf = []
    if kPf > 0:
        qw = 0; cb = 0; c = 0
        while c < kPf and c < n_all:
            init_pf.append(qw + cb)
            cb += 2
            if cb == nf: cb = 0; qw += BAND
            c += 2
    def band_jump(d):
        nonlocal P
        P += BAND - (nf - 1 - d)
    def load_pair(s0, s1):
        nonlocal lc, P
        if kPf: prefetch_pair()
        slots[s0] = P; slots[s1] = P+1; loads.extend([P, P+1])
        lc += 2
        if lc == nf: lc = 0; band_jump(1)
        else: P += 2
    def load_one(s0):
        nonlocal lc, P
        if kPf and lc % 2 == 0: prefetch_pair()
        slots[s0] = P; loads.append(P)
        lc += 1
        if lc == nf: lc = 0; band_jump(0)
        else: P += 1
    cc = 0; b = 0
    def finish():
        nonlocal cc, b
        cc += 2
        if cc == nf: stores.append((b, len(computes))); cc = 0; b += 1
    if pairs:
        load_pair(0, 1)
        for n in range(0, n_all, 4):
            for u in range(4):
                if u % 2 == 0 and n+u+2 < n_all: load_pair((u+2)%4, (u+3)%4)
                if n+u < n_all:
                    computes.append(slots[u])
                    if u % 2 == 1: finish()
    else:
        load_one(0)
        for n in range(0, n_all, 2):
            for u in range(2):
                if n+u+1 < n_all: load_one((u+1)%2)
                computes.append(slots[u]); 
                if u == 1: finish()
    exp = [bb*BAND + c for bb in range(nb) for c in range(nf)]
    assert computes == exp, (nf, nb, kPf, pairs, computes[:30])
    assert stores == [(bb, (bb+1)*nf) for bb in range(nb)], stores
    # prefetch: every even chunk of exp is prefetched exactly once (the lines), before it is loaded
    allpf = init_pf + pf
    want = [x for i, x in enumerate(exp) if i % 2 == 0]
    if kPf: assert sorted(allpf) == sorted(want) and len(set(allpf)) == len(allpf), (nf, nb, kPf, pairs, allpf, want)
    return True
for nf in (2, 4, 16, 18, 32, 40):
    for nb in (1, 2, 3):
        for kPf in (0, 6, 12):
            for pairs in (True, False):
                sim(nf, nb, kPf, pairs)
print("ok")
