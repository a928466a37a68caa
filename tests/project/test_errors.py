"""One error hierarchy: every exception class Ringmaster defines derives from RingmasterError,
so a caller can catch all of them, and each carries the CLI's exit code."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

from namespace_tree import package_dirs

from ringmaster.common.errors import RingmasterError, UsageError


def _modules() -> list:
    """Every module of the installed namespace (each mapped folder walked under its own name)."""
    dirs = package_dirs()
    # worker/torch is ringmaster.torch, never ringmaster.worker.torch: skip such second names.
    shadows = {outer + "." + ".".join(inner_dir.relative_to(outer_dir).parts)
               for outer, outer_dir in dirs.items() for inner_dir in dirs.values()
               if inner_dir != outer_dir and inner_dir.is_relative_to(outer_dir)}
    found = []
    for package in dirs:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, package + ".",
                                          onerror=lambda name: None):
            if any(info.name == s or info.name.startswith(s + ".") for s in shadows):
                continue
            if info.name.startswith("ringmaster.proto.") or info.name.endswith("__main__"):
                continue
            found.append(importlib.import_module(info.name))
    return found


def test_every_error_class_derives_from_the_common_base() -> None:
    defined = {
        obj for module in _modules() for _, obj in inspect.getmembers(module, inspect.isclass)
        if issubclass(obj, BaseException) and obj.__module__.startswith("ringmaster.")
    }
    assert len(defined) >= 15, sorted(c.__name__ for c in defined)
    outside = sorted(c.__qualname__ for c in defined if not issubclass(c, RingmasterError))
    assert outside == []


def test_usage_errors_exit_with_two_and_horovod_names_stay_runtime_errors() -> None:
    from ringmaster.discovery import DiscoveryError
    from ringmaster.torch import HorovodInternalError, HostsUpdatedInterrupt

    assert DiscoveryError("x").exit_code == UsageError.exit_code == 2
    assert issubclass(HorovodInternalError, RuntimeError) and issubclass(HostsUpdatedInterrupt, RuntimeError)
