#!/usr/bin/env python3
"""Independent reference of the context codecs of docs/codecs.md ("ctx", "ctxgaps"), written
from that text alone. Prints, one `name hex` line each, the golden vectors of
crates/deltacast/src/codec/context/tests.rs and gaps/tests.rs, and the sections of a long
deterministic case (20,000 BF16 elements, so that models halve their counts), which the test
`context::tests::the_python_reference_writes_the_same_bytes` compares with the crate's."""


class Model:
    def __init__(s): s.z = 0; s.t = 0
    def p0(s):
        p = ((2 * s.z + 1) << 15) // (2 * s.t + 2); return min(max(p, 1), (1 << 15) - 1)
    def up(s, x):
        s.z += (x == 0); s.t += 1
        if s.t == 1024: s.z >>= 1; s.t >>= 1


class Enc:
    def __init__(s): s.low = 0; s.range = 2**32 - 1; s.held = None; s.ff = 0; s.out = []
    def bit(s, p0, x):
        b = (s.range >> 15) * p0
        if x == 0: s.range = b
        else: s.low += b; s.range -= b
        while s.range < 2**24: s.range = (s.range << 8) & 0xFFFFFFFF; s.shift()
    def shift(s):
        if s.low < 0xFF000000 or s.low >= 2**32:
            c = s.low >> 32
            if s.held is not None: s.out.append((s.held + c) & 0xFF)
            s.out += [(0xFF + c) & 0xFF] * s.ff; s.ff = 0
            s.held = (s.low >> 24) & 0xFF
        else: s.ff += 1
        s.low = (s.low & 0xFFFFFF) << 8
    def mbit(s, m, x): s.bit(m.p0(), x); m.up(x)
    def direct(s, v, n):
        for i in range(n - 1, -1, -1): s.bit(1 << 14, (v >> i) & 1)
    def finish(s):
        for _ in range(5): s.shift()
        return s.out


def ordv(x, nb):
    sign = 1 << (nb - 1); mask = (1 << nb) - 1
    return (~x) & mask if x & sign else x | sign


def ctx_positions(held, rel, nb):
    e = Enc(); ms = [Model() for _ in range(256)]; changed = set(rel)
    for i in range(rel[-1] + 1):
        e.mbit(ms[(held[i] >> (nb - 9)) & 0xFF], 1 if i in changed else 0)
    return e.finish()


def ctx_values(held, rel, new, nb):
    e = Enc(); S = 2 * nb + 2; ms = [Model() for _ in range(512 * S)]
    for k, p in enumerate(rel):
        a = held[p]; b = new[k]; mask = (1 << nb) - 1
        d = (ordv(b, nb) - ordv(a, nb)) & mask; neg = d >> (nb - 1) == 1; v = ((-d) & mask) if neg else d
        c = ((a >> (nb - 9)) & 0x1FF) * S; M = lambda j: ms[c + j]
        e.mbit(M(0), int(v != 1))
        if v != 1:
            t = max(v - 1, 0); L = t.bit_length()
            for j in range(nb - 1):
                e.mbit(M(1 + j), int(L > j))
                if not L > j: break
            if L >= 2:
                e.mbit(M(nb + 1 + L), (t >> (L - 2)) & 1)
                for i in range(L - 3, -1, -1): e.bit(1 << 14, (t >> i) & 1)
        if v not in (0, 1 << (nb - 1)):
            e.mbit(M(nb if v == 1 else nb + 1), int(neg))
    return e.finish()


def ctxgaps(held, rel, nb, base, steps, params):
    """ctxgaps positions with the class map (base, steps) and the Golomb parameters given."""
    def cls(a):
        s = min(max(((a >> (nb - 9)) & 0xFF) - base, 0), 15)
        return bin(steps & ((1 << (s + 1)) - 2)).count('1')
    K = bin(steps).count('1') + 1
    e = Enc(); plain = []
    def gamma(x):
        v = x + 1; l = v.bit_length()
        for _ in range(l - 1): e.direct(1, 1)
        e.direct(0, 1); e.direct(v & ((1 << (l - 1)) - 1), l - 1)
    e.direct(base, 8); e.direct(steps >> 1, 15)
    # Each change's rank among its class's members, in position order.
    changed = set(rel); seen = [0] * K; ranks = [[] for _ in range(K)]
    for i, a in enumerate(held):
        c = cls(a)
        if i in changed: ranks[c].append(seen[c])
        seen[c] += 1
    for c in range(K - 1): gamma(len(ranks[c]))
    for c in range(K):
        if ranks[c]: gamma(params[c] - 1)
    for c in range(K):
        ms = [Model() for _ in range(16)]; m = params[c]; prev = -1
        for r_ in ranks[c]:
            gap = r_ - prev - 1; prev = r_
            q, r = divmod(gap, m)
            for j in range(q): e.mbit(ms[min(j, 15)], 1)
            e.mbit(ms[min(q, 15)], 0)
            if m > 1:
                b = (m - 1).bit_length(); u = (1 << b) - m
                if r < u: plain += [(r >> k) & 1 for k in range(b - 1)]
                else:
                    t = r - u; x = u + (t >> 1)
                    plain += [(x >> k) & 1 for k in range(b - 1)] + [t & 1]
    coded = e.finish()
    raw = [sum(bit << k for k, bit in enumerate(plain[i:i + 8])) for i in range(0, len(plain), 8)]
    return list(len(coded).to_bytes(4, 'little')) + coded + raw


def long_case():
    """20,000 BF16 elements of four sign-and-exponent classes, ~30 % changed by ±1 to ±3 ULP,
    from a 64-bit LCG (the test builds the same)."""
    x = 1; held = []; rel = []; new = []
    def step():
        nonlocal x
        x = (x * 6364136223846793005 + 1442695040888963407) % 2**64
        return x >> 33
    for i in range(20000):
        r = step()
        held.append((0x8000 if r & 1 else 0) | ((120 + (r >> 1) % 2) << 7) | ((r >> 2) & 0x7F))
        if step() % 10 < 3:
            rel.append(i)
            d = [1, -1, 2, -3][step() % 4]
            new.append(ordinv((ordv(held[i], 16) + d) % 2**16, 16))
    return held, rel, new


def ordinv(o, nb):
    sign = 1 << (nb - 1); mask = (1 << nb) - 1
    return o & ~sign & mask if o & sign else (~o) & mask


def hexs(b): return ' '.join('%02x' % v for v in b)


nb = 16
held = [0x3F80] * 4 + [0x3580] * 4; rel = [1, 5, 6]; new = [0x3F81, 0x357F, 0x3583]
print('positions', hexs(ctx_positions(held, rel, nb)))
print('values', hexs(ctx_values(held, rel, new, nb)))
print('ctxgaps_chosen', hexs(ctxgaps(held, rel, nb, 93, 0, [2])))
print('ctxgaps_two_classes', hexs(ctxgaps(held, rel, nb, 106, 1 << 2, [1, 2])))
held, rel, new = long_case()
print('long_positions', hexs(ctx_positions(held, rel, nb)))
print('long_values', hexs(ctx_values(held, rel, new, nb)))
print('long_ctxgaps', hexs(ctxgaps(held, rel, nb, 119, 1 << 2, [3, 2])))
