#!/usr/bin/env python3
"""Checks that the modules of zblk's crates import only downward.

docs/architecture.md holds one layer table per crate (a markdown table
whose first column is the layer, 1 the top, and whose second names the
modules in backquotes; names in parentheses are submodules and belong to
the module before them). For each crate this script reads every module's
imports (every `crate::NAME` path, and `super::NAME` in a submodule of a
directory module; tests excluded) and exits 1 when

- an import points to a module of a higher layer (a smaller number),
- a module is missing from the table, or the table names one that does
  not exist,
- the imports form a cycle (possible within one layer),
- a module reaches a root re-export (`crate::Name`), which hides an edge.

Otherwise it prints each crate's modules in layer order with their
imports. Run by tests/run.sh; tested by tools/scripts/test_engine_dag.py.

Usage: engine-dag.py [--root DIR] [CRATE...]   (CRATE: engine, daemon, cli)
"""
import argparse
import os
import re
import sys

DOC = os.path.join("docs", "architecture.md")


class Crate:
    """Where a crate's modules are and which heading its table is under.

    `parent`: for a directory module checked on its own (the CLI), the
    name its `mod.rs` stands for; `super::NAME` and `crate::PREFIX::NAME`
    then reach sibling NAME, or the parent when NAME is not a module.
    """

    def __init__(self, name, src, heading, parent=None, prefix=None):
        self.name, self.src, self.heading = name, src, heading
        self.parent, self.prefix = parent, prefix


CRATES = {
    "engine": Crate("engine", "src", "The engine's layers"),
    "daemon": Crate("daemon", os.path.join("ublk-target", "src"), "The daemon's layers"),
    "cli": Crate(
        "cli",
        os.path.join("tools", "src", "cli"),
        "The command line's layers",
        parent="cli",
        prefix="cli",
    ),
}


class Failure(Exception):
    pass


def read_table(doc_text, heading):
    """{module: layer} from the table under `## heading`."""
    m = re.search(r"^##+ " + re.escape(heading) + r"\s*$", doc_text, re.M)
    if not m:
        raise Failure(f"{DOC}: no section '{heading}'")
    layers = {}
    in_table = False
    for line in doc_text[m.end():].splitlines():
        if line.startswith("#"):
            break
        if not line.startswith("|"):
            if in_table:
                break
            continue
        in_table = True
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not re.fullmatch(r"\d+", cells[0]):
            continue  # the header row and its rule
        layer = int(cells[0])
        # Submodules, named in parentheses, are parts of the module before.
        names = re.sub(r"\([^)]*\)", "", cells[1])
        for name in re.findall(r"`([a-z_][a-z0-9_]*)`", names):
            if name in layers:
                raise Failure(f"{DOC} ({heading}): `{name}` is in two rows")
            layers[name] = layer
    if not layers:
        raise Failure(f"{DOC} ({heading}): no table")
    return layers


def strip_tests(text):
    # Drop an inline `#[cfg(test)] mod tests { ... }` (to the end of the
    # file, where the project keeps them) and comments.
    m = re.search(r"#\[cfg\(test\)\]\s*mod tests\s*\{", text)
    if m:
        text = text[: m.start()]
    return re.sub(r"//.*", "", text)


def unit_of(crate, src, path):
    """The module of the table a source file belongs to (None: skip)."""
    rel = os.path.relpath(path, src).split(os.sep)
    if crate.parent:
        if len(rel) == 1 and rel[0] == "mod.rs":
            return crate.parent
        first = rel[0]
    else:
        first = rel[0]
        if len(rel) == 1 and first in ("lib.rs", "main.rs"):
            return None
    return first[:-3] if first.endswith(".rs") else first


def names_after(prefix, text):
    """Module names reached through `prefix::NAME` or `prefix::{a, b::{c}}`
    (each item's first segment)."""
    found = set(re.findall(r"\b" + prefix + r"::([A-Za-z_]\w*)", text))
    for m in re.finditer(r"\b" + prefix + r"::\{", text):
        depth, items, item = 0, [], ""
        for c in text[m.end():]:
            if c == "}" and depth == 0:
                break
            depth += {"{": 1, "}": -1}.get(c, 0)
            if c == "," and depth == 0:
                items.append(item)
                item = ""
            else:
                item += c
        items.append(item)
        for it in items:
            first = re.match(r"\s*([A-Za-z_]\w*)", it)
            if first:
                found.add(first.group(1))
    return found


def edges(crate, root):
    src = os.path.join(root, crate.src)
    if not os.path.isdir(src):
        raise Failure(f"{crate.src}: no such directory")
    files = []
    for d, _, fs in os.walk(src):
        for f in sorted(fs):
            if f.endswith(".rs") and f != "tests.rs":
                files.append(os.path.join(d, f))
    units = {unit_of(crate, src, p) for p in files} - {None}
    deps = {u: set() for u in units}
    for path in files:
        unit = unit_of(crate, src, path)
        if unit is None:
            continue
        with open(path) as fh:
            text = strip_tests(fh.read())
        # `super::super::` in an inline module names what `super::` does
        # in the file's own.
        text = re.sub(r"(?:\bsuper::){2,}", "super::", text)
        rel = os.path.relpath(path, root)
        if crate.parent:
            # A submodule reaches its siblings and the parent through
            # `super::`; the parent reaches its children by their names.
            reached = names_after(r"crate::" + crate.prefix, text)
            if unit != crate.parent:
                reached |= names_after(r"(?<!::)super", text)
            else:
                reached |= {
                    u
                    for u in units
                    if re.search(r"(?<![:\w])" + u + r"::", text)
                }
            for name in reached:
                target = name if name in units else crate.parent
                if target != unit:
                    deps[unit].add(target)
        else:
            rooted = re.findall(r"\bcrate::\{?([A-Z]\w*)", text)
            if rooted:
                raise Failure(f"{rel}: use the defining module, not crate::{rooted[0]}")
            found = {n for n in names_after("crate", text) if not n[0].isupper()}
            deps[unit] |= {d for d in found if d != unit}
    return deps


def check(crate, root):
    with open(os.path.join(root, DOC)) as fh:
        layers = read_table(fh.read(), crate.heading)
    deps = edges(crate, root)
    errors = []
    for m in sorted(set(deps) - set(layers)):
        errors.append(f"module `{m}` is not in the table '{crate.heading}' of {DOC}")
    for m in sorted(set(layers) - set(deps)):
        errors.append(f"the table '{crate.heading}' names `{m}`, which has no source file")
    for m in sorted(deps):
        for d in sorted(deps[m]):
            if m in layers and d in layers and layers[d] < layers[m]:
                errors.append(
                    f"{crate.name}: `{m}` (layer {layers[m]}) imports `{d}` "
                    f"(layer {layers[d]}), a higher layer"
                )
    if errors:
        raise Failure("\n".join(errors))

    order, state = [], {}

    def visit(m, stack):
        if state.get(m) == "done":
            return
        if state.get(m) == "open":
            cycle = stack[stack.index(m):] + [m]
            raise Failure(f"{crate.name} import cycle: " + " -> ".join(cycle))
        state[m] = "open"
        for d in sorted(deps.get(m, ())):
            visit(d, stack + [m])
        state[m] = "done"
        order.append(m)

    for m in sorted(deps, key=lambda m: (-layers[m], m)):
        visit(m, [])
    for m in order:
        print(f"{layers[m]} {m}: {', '.join(sorted(deps[m])) or '-'}")
    print(f"{crate.name}: imports go downward, no cycle ({len(order)} modules)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    ap.add_argument("--root", default=default_root, help="the repository's root")
    ap.add_argument("crates", nargs="*", help="engine, daemon, cli (default: all)")
    args = ap.parse_args(argv)
    unknown = [c for c in args.crates if c not in CRATES]
    if unknown:
        ap.error(f"unknown crate {unknown[0]}: one of {', '.join(CRATES)}")
    try:
        for name in args.crates or CRATES:
            check(CRATES[name], args.root)
    except Failure as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
