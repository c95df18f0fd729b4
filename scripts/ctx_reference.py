#!/usr/bin/env python3
"""Independent reference of the ctx codecs of docs/codecs.md ("ctx"), written from that text
alone: prints the golden vectors, which must match crates/deltacast/src/codec/context/tests.rs
and (ctxgaps) crates/deltacast/src/codec/context/gaps/tests.rs."""
class Model:
    def __init__(s): s.z=0; s.t=0
    def p0(s):
        p=((2*s.z+1)<<15)//(2*s.t+2); return min(max(p,1),(1<<15)-1)
    def up(s,x):
        s.z+= (x==0); s.t+=1
        if s.t==1024: s.z>>=1; s.t>>=1
class Enc:
    def __init__(s): s.low=0; s.range=2**32-1; s.held=None; s.ff=0; s.out=[]
    def bit(s,p0,x):
        b=(s.range>>15)*p0
        if x==0: s.range=b
        else: s.low+=b; s.range-=b
        while s.range<2**24: s.range=(s.range<<8)&0xFFFFFFFF; s.shift()
    def shift(s):
        if s.low<0xFF000000 or s.low>=2**32:
            c=s.low>>32
            if s.held is not None: s.out.append((s.held+c)&0xFF)
            s.out+= [(0xFF+c)&0xFF]*s.ff; s.ff=0
            s.held=(s.low>>24)&0xFF
        else: s.ff+=1
        s.low=(s.low&0xFFFFFF)<<8
    def mbit(s,m,x): s.bit(m.p0(),x); m.up(x)
    def finish(s):
        for _ in range(5): s.shift()
        return s.out
def ordv(x,nb):
    sign=1<<(nb-1); mask=(1<<nb)-1
    return (~x)&mask if x&sign else x|sign
nb=16
held=[0x3F80]*4+[0x3580]*4; rel=[1,5,6]; new=[0x3F81,0x357F,0x3583]
e=Enc(); ms=[Model() for _ in range(256)]
for i in range(rel[-1]+1):
    e.mbit(ms[(held[i]>>(nb-9))&0xFF], 1 if i in rel else 0)
print('positions', ' '.join('%02x'%b for b in e.finish()))
e=Enc(); S=2*nb+2; ms=[Model() for _ in range(512*S)]
for k,p in enumerate(rel):
    a=held[p]; b=new[k]; mask=(1<<nb)-1
    d=(ordv(b,nb)-ordv(a,nb))&mask; neg=d>>(nb-1)==1; v=((-d)&mask) if neg else d
    c=((a>>(nb-9))&0x1FF)*S; M=lambda j: ms[c+j]
    e.mbit(M(0), int(v!=1))
    if v!=1:
        t=max(v-1,0); L=t.bit_length()
        for j in range(nb-1):
            e.mbit(M(1+j), int(L>j))
            if not L>j: break
        if L>=2:
            e.mbit(M(nb+1+L), (t>>(L-2))&1)
            for i in range(L-3,-1,-1): e.bit(1<<14,(t>>i)&1)
    if v not in (0,1<<(nb-1)):
        e.mbit(M(nb if v==1 else nb+1), int(neg))
print('values', ' '.join('%02x'%b for b in e.finish()))

# ctxgaps positions (docs/codecs.md, "ctxgaps"), the golden vectors' maps and parameters given.
def ctxgaps(held, rel, nb, base, steps, params):
    def cls(a):
        s = min(max(((a >> (nb - 9)) & 0xFF) - base, 0), 15)
        return bin(steps & ((1 << (s + 1)) - 2)).count('1')
    K = bin(steps).count('1') + 1
    e = Enc(); plain = []
    def direct(v, n):
        for i in range(n - 1, -1, -1): e.bit(1 << 14, (v >> i) & 1)
    def gamma(x):
        v = x + 1; l = v.bit_length()
        for _ in range(l - 1): direct(1, 1)
        direct(0, 1); direct(v & ((1 << (l - 1)) - 1), l - 1)
    direct(base, 8); direct(steps >> 1, 15)
    members = [[i for i in range(len(held)) if cls(held[i]) == c] for c in range(K)]
    changes = [[i for i in rel if cls(held[i]) == c] for c in range(K)]
    for c in range(K - 1): gamma(len(changes[c]))
    for c in range(K):
        if changes[c]: gamma(params[c] - 1)
    for c in range(K):
        ms = [Model() for _ in range(16)]; m = params[c]; prev = -1
        for i in changes[c]:
            gap = sum(1 for j in members[c] if prev < j < i); prev = i
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
print('ctxgaps chosen', ' '.join('%02x' % b for b in ctxgaps(held, rel, nb, 93, 0, [2])))
print('ctxgaps two classes', ' '.join('%02x' % b for b in ctxgaps(held, rel, nb, 106, 1 << 2, [1, 2])))
