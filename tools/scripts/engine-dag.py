#!/usr/bin/env python3
"""Checks that the engine's modules import each other as a DAG.

Every `crate::NAME` path in a module of `src/` (a `use` or an inline path,
tests excluded) is an edge from that top-level module to NAME. Prints the
modules in layer order (each imports only modules printed before it) and
exits 1 naming a cycle if there is one. Run by tests/run.sh.
"""
import os
import re
import sys

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src")


def top_module(path):
    rel = os.path.relpath(path, SRC)
    first = rel.split(os.sep)[0]
    return first[:-3] if first.endswith(".rs") else first


def strip_tests(text):
    # Drop `#[cfg(test)] mod tests { ... }` (to the end of file, where the
    # project keeps them) and comments.
    m = re.search(r"#\[cfg\(test\)\]\s*mod tests", text)
    if m:
        text = text[: m.start()]
    return re.sub(r"//.*", "", text)


def edges():
    deps = {}
    for root, _, files in os.walk(SRC):
        for f in files:
            if not f.endswith(".rs") or f == "tests.rs":
                continue
            path = os.path.join(root, f)
            mod = top_module(path)
            if mod == "lib":
                continue
            with open(path) as fh:
                text = strip_tests(fh.read())
            rooted = re.findall(r"\bcrate::\{?([A-Z]\w*)", text)
            if rooted:
                # A root re-export hides which module it comes from.
                sys.exit(f"{path}: use the defining module, not crate::{rooted[0]}")
            found = set(re.findall(r"\bcrate::([a-z_]+)", text))
            # `use crate::{a, b::c}` groups.
            for group in re.findall(r"\bcrate::\{([^}]*)\}", text):
                found |= set(re.findall(r"(?:^|,)\s*([a-z_]+)", group))
            deps.setdefault(mod, set()).update(d for d in found if d != mod)
    return deps


def main():
    deps = edges()
    mods = set(deps) | {d for ds in deps.values() for d in ds}
    order, state = [], {}

    def visit(m, stack):
        if state.get(m) == "done":
            return
        if state.get(m) == "open":
            cycle = stack[stack.index(m):] + [m]
            sys.exit("engine import cycle: " + " -> ".join(cycle))
        state[m] = "open"
        for d in sorted(deps.get(m, ())):
            visit(d, stack + [m])
        state[m] = "done"
        order.append(m)

    for m in sorted(mods):
        visit(m, [])
    for m in order:
        print(f"{m}: {', '.join(sorted(deps.get(m, ()))) or '-'}")
    print(f"engine imports form a DAG ({len(order)} modules)")


if __name__ == "__main__":
    main()
