#!/usr/bin/env python3
"""Tests of engine-dag.py on small trees made in a temporary directory:
it passes on imports that go downward and fails on one that points to a
higher layer, on a module its table misses, and on a cycle. Run by
tests/run.sh (python3 tools/scripts/test_engine_dag.py)."""
import contextlib
import importlib.util
import io
import os
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("engine_dag", os.path.join(HERE, "engine-dag.py"))
dag = importlib.util.module_from_spec(spec)
spec.loader.exec_module(dag)

TABLE = """\
# map

## The engine's layers

| layer | module | what it does |
| --- | --- | --- |
| 1 | `store` (`ops`) | the top |
| 2 | `table`, `read` | the middle |
| 3 | `error` | the bottom |

## The daemon's layers

| layer | module | what it does |
| --- | --- | --- |
| 1 | `daemon` | the top |
| 2 | `paths` | the bottom |

## The command line's layers

| layer | module | what it does |
| --- | --- | --- |
| 1 | `cli` | mod.rs |
| 2 | `show` | a verb |
| 3 | `base` | the error |
"""


class EngineDag(unittest.TestCase):
    def tree(self, files, doc=TABLE):
        """A repository with `files` ({path: text}) and the map `doc`."""
        root = tempfile.mkdtemp(prefix="engine-dag-test.")
        self.addCleanup(lambda: __import__("shutil").rmtree(root))
        files = dict(files)
        files[os.path.join("docs", "architecture.md")] = doc
        for path, text in files.items():
            full = os.path.join(root, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w") as fh:
                fh.write(textwrap.dedent(text))
        return root

    def run_dag(self, root, *crates):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = dag.main(["--root", root, *crates])
        return rc, out.getvalue() + err.getvalue()

    def engine(self, **overrides):
        files = {
            "src/lib.rs": "pub mod store;\nmod table;\nmod read;\nmod error;\n",
            "src/store/mod.rs": "mod ops;\nuse crate::table::SlotTable;\n",
            "src/store/ops.rs": "use super::Store;\nuse crate::{read, error::Error};\n",
            "src/table.rs": "use crate::error::Result;\nuse crate::read::x;\n",
            "src/read.rs": "use crate::error::{Error, Result};\n",
            "src/error.rs": "pub enum Error {}\n",
        }
        files.update({f"src/{k}": v for k, v in overrides.items()})
        return self.tree(files)

    def test_passes_on_downward_imports(self):
        rc, out = self.run_dag(self.engine(), "engine")
        self.assertEqual(rc, 0, out)
        self.assertIn("imports go downward", out)

    def test_fails_on_an_import_of_a_higher_layer(self):
        root = self.engine(**{"error.rs": "use crate::store::QueueCtx;\n"})
        rc, out = self.run_dag(root, "engine")
        self.assertEqual(rc, 1, out)
        self.assertIn("`error` (layer 3) imports `store` (layer 1), a higher layer", out)

    def test_a_grouped_inline_path_counts_too(self):
        body = "use crate::{table::{self, T}, read};\n"
        rc, out = self.run_dag(self.engine(**{"error.rs": body}), "engine")
        self.assertEqual(rc, 1, out)
        self.assertIn("imports `read` (layer 2)", out)
        self.assertIn("imports `table` (layer 2)", out)

    def test_imports_in_tests_do_not_count(self):
        body = "pub enum Error {}\n#[cfg(test)]\nmod tests {\n    use crate::store::Store;\n}\n"
        rc, out = self.run_dag(self.engine(**{"error.rs": body}), "engine")
        self.assertEqual(rc, 0, out)

    def test_fails_on_a_module_the_table_misses(self):
        rc, out = self.run_dag(self.engine(**{"extra.rs": "use crate::error::Error;\n"}), "engine")
        self.assertEqual(rc, 1, out)
        self.assertIn("module `extra` is not in the table", out)

    def test_fails_on_a_cycle_within_a_layer(self):
        rc, out = self.run_dag(self.engine(**{"read.rs": "use crate::table::SlotTable;\n"}), "engine")
        self.assertEqual(rc, 1, out)
        self.assertIn("import cycle", out)

    def test_fails_on_a_root_re_export(self):
        rc, out = self.run_dag(self.engine(**{"read.rs": "use crate::Error;\n"}), "engine")
        self.assertEqual(rc, 1, out)
        self.assertIn("not crate::Error", out)

    def cli(self, show):
        return self.tree(
            {
                "tools/src/cli/mod.rs": "mod base;\nmod show;\npub use base::CliError;\n"
                "fn run() { show::list() }\n",
                "tools/src/cli/show.rs": show,
                "tools/src/cli/base.rs": "pub struct CliError;\n",
            }
        )

    def test_cli_submodules_import_siblings_not_the_parent(self):
        rc, out = self.run_dag(self.cli("use super::{base::{CliError}};\n"), "cli")
        self.assertEqual(rc, 0, out)
        rc, out = self.run_dag(self.cli("use super::{base, CliError};\n"), "cli")
        self.assertEqual(rc, 1, out)
        self.assertIn("`show` (layer 2) imports `cli` (layer 1)", out)

    def test_daemon_table(self):
        files = {
            "ublk-target/src/lib.rs": "pub mod daemon;\npub mod paths;\n",
            "ublk-target/src/daemon.rs": "use crate::paths;\n",
            "ublk-target/src/paths.rs": "pub const RUN: &str = \"/run\";\n",
        }
        rc, out = self.run_dag(self.tree(files), "daemon")
        self.assertEqual(rc, 0, out)
        files["ublk-target/src/paths.rs"] = "use crate::daemon::run;\n"
        rc, out = self.run_dag(self.tree(files), "daemon")
        self.assertEqual(rc, 1, out)
        self.assertIn("`paths` (layer 2) imports `daemon` (layer 1)", out)


if __name__ == "__main__":
    unittest.main()
