"""The sattrib dashboard: its parts (datasette/sattrib_dashboard/) registered as plugins one by
one, the way Datasette registers its own (datasette/plugins.py: a list of modules, each given
to the plugin manager under its name).

Datasette runs each *.py file of a plugins directory by its path, outside any package, so the
parts' folder is made the package `sattrib_dashboard` here first and the parts import one
another by that name. (datasette/ itself has no __init__.py: it would shadow Datasette in a
source tree.) Everything shown comes from the diagnoses database through read-only connections.
"""
import importlib
import importlib.machinery
import importlib.util
import sys
from pathlib import Path

from datasette.plugins import pm

PACKAGE = "sattrib_dashboard"
# The parts that hook into Datasette. charts (the SVG charts) is used by the pages that draw.
PARTS = ("database", "guards", "cells", "shown", "summary", "home", "job", "diagnosis", "node",
         "gpu")


def _package():
    if PACKAGE not in sys.modules:
        spec = importlib.machinery.ModuleSpec(PACKAGE, None, is_package=True)
        spec.submodule_search_locations = [str(Path(__file__).resolve().parent.parent / PACKAGE)]
        sys.modules[PACKAGE] = importlib.util.module_from_spec(spec)


_package()
for part in PARTS:
    name = f"{PACKAGE}.{part}"
    if pm.get_plugin(name) is None:
        pm.register(importlib.import_module(name), name)
