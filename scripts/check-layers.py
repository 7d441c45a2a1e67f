#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""check-layers.py - the core's object files call in one direction only.

Reads the symbols each object of the core defines and uses (nm on the
build's libtool objects), draws the graph "object A uses a symbol defined in
object B", and fails
  - if any strongly connected component of it has more than one object: a
    cycle means two files (or a ring of them) call each other, so neither
    sits below the other;
  - if an object calls one in a layer above its own (LAYERS below, the
    layers of doc/architecture.md and src/internal.h), or is in no layer
    (a new file must be placed).

  scripts/check-layers.py BUILDDIR            check src/ (the core); exit 1 on a cycle
  scripts/check-layers.py BUILDDIR --all      also transports/ (one graph)
  scripts/check-layers.py BUILDDIR --dot F    write the graph (Graphviz) to F
  scripts/check-layers.py BUILDDIR --edges    print every edge with its symbols

It exits 2 when it finds no objects (build first), so it cannot pass by
reading nothing.
"""
import argparse
import os
import subprocess
import sys


# Bottom to top.  Within a layer any direction is allowed (no cycle, still).
LAYERS = [
    ("base", ["src/errors.c", "src/log.c", "src/util.c", "src/envvar.c",
              "src/env.c", "src/pmi.c", "src/pmix.c", "src/topo.c",
              "src/affinity.c", "src/reduce.c", "src/compress.c",
              "src/bootstrap.c"]),
    ("transport", ["src/transport.c", "transports/"]),
    ("memory", ["src/mem.c"]),
    ("peers", ["src/peer.c"]),
    ("recovery", ["src/agree.c"]),
    ("algorithms", ["src/algo/"]),
    ("engine", ["src/lock.c", "src/request.c", "src/progress.c",
                "src/p2p.c"]),
    ("entry points", ["src/comm.c", "src/coll.c", "src/buckets.c",
                      "src/sendrecv.c", "src/split.c", "src/recover.c"]),
]


def layer_of(name):
    for i, (_, members) in enumerate(LAYERS):
        for m in members:
            if name == m or (m.endswith("/") and name.startswith(m)):
                return i
    return None


def objects(builddir, dirs):
    """{name: path} of the libfrcore objects under builddir/<dirs>."""
    found = {}
    for d in dirs:
        top = os.path.join(builddir, d)
        for root, _, files in os.walk(top):
            if not root.endswith(".libs"):
                continue
            for f in files:
                if not (f.startswith("libfrcore_la-") and f.endswith(".o")):
                    continue
                rel = os.path.relpath(os.path.dirname(root), builddir)
                name = os.path.join(rel, f[len("libfrcore_la-"):-2] + ".c")
                found[name] = os.path.join(root, f)
    return found


def symbols(path):
    """(defined, undefined) global symbol names of one object."""
    out = subprocess.run(["nm", "-P", path], check=True, capture_output=True,
                         text=True).stdout
    defined, used = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        sym, kind = parts[0], parts[1]
        if kind == "U":
            used.add(sym)
        elif kind in "TDBRCVWGSi":  # global definitions (local ones cannot link)
            defined.add(sym)
    return defined, used


def tarjan(nodes, edges):
    """Strongly connected components (iterative Tarjan)."""
    index, low, on, stack, comps = {}, {}, set(), [], []
    counter = [0]
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                u = work[-1][0]
                low[u] = min(low[u], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                comps.append(sorted(comp))
    return comps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("builddir")
    ap.add_argument("--all", action="store_true",
                    help="transports/ too, in the same graph")
    ap.add_argument("--dot", metavar="FILE")
    ap.add_argument("--edges", action="store_true")
    a = ap.parse_args()

    dirs = ["src"] + (["transports"] if a.all else [])
    objs = objects(a.builddir, dirs)
    if len(objs) < 2:
        print(f"check-layers: no core objects under {a.builddir} (build first)",
              file=sys.stderr)
        return 2
    defs, uses = {}, {}
    owner = {}
    for name, path in objs.items():
        d, u = symbols(path)
        defs[name], uses[name] = d, u
        for s in d:
            owner.setdefault(s, name)
    edges, why = {}, {}
    for name in objs:
        for s in uses[name]:
            o = owner.get(s)
            if o is None or o == name:
                continue
            edges.setdefault(name, set()).add(o)
            why.setdefault((name, o), set()).add(s)

    if a.edges:
        for (x, y), syms in sorted(why.items()):
            print(f"{x} -> {y}: {' '.join(sorted(syms))}")
    if a.dot:
        with open(a.dot, "w") as f:
            f.write("digraph core {\n  rankdir=TB; node [shape=box];\n")
            for (x, y) in sorted(why):
                f.write(f'  "{x}" -> "{y}";\n')
            f.write("}\n")

    rc = 0
    for name in sorted(objs):
        if layer_of(name) is None:
            print(f"check-layers: {name} is in no layer (add it to LAYERS)")
            rc = 1
    for (x, y), syms in sorted(why.items()):
        lx, ly = layer_of(x), layer_of(y)
        if lx is not None and ly is not None and ly > lx:
            print(f"check-layers: {x} ({LAYERS[lx][0]}) calls up into "
                  f"{y} ({LAYERS[ly][0]}): {' '.join(sorted(syms))}")
            rc = 1
    bad = [c for c in tarjan(set(objs), edges) if len(c) > 1]
    nedges = sum(len(v) for v in edges.values())
    if not bad and not rc:
        print(f"check-layers: {len(objs)} objects, {nedges} edges, "
              f"no cycle, no call upwards")
        return 0
    for c in bad:
        print(f"check-layers: cycle among {len(c)} objects: {' '.join(c)}")
        members = set(c)
        for (x, y), syms in sorted(why.items()):
            if x in members and y in members:
                print(f"    {x} -> {y}: {' '.join(sorted(syms))}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
