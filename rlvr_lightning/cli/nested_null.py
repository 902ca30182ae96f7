"""`--model.init_args.GROUP.FIELD=null` on the command line: a shim for a jsonargparse bug (4.53 and before).

jsonargparse hands a command-line value nested in a class's `init_args` to that class's own parser as text,
`f"--{key}={value}"`, after it has parsed the value already: a null comes back as the text "None", which YAML
reads as a string, so `--model.init_args.update.mini_batch_size=null` failed with "Expected a <class 'int'>"
for "None". The shim keeps such a null as the text "null", which the class's parser reads as null again.
Setting the option in a YAML file, or a whole group (`--model.init_args.update='{mini_batch_size: null}'`),
never needed it.
"""

from __future__ import annotations

import functools


def keep_nested_nulls() -> None:
    """Wrap jsonargparse's `subclass_spec_as_namespace` (idempotent; nothing to do where it does not exist)."""
    from jsonargparse import Namespace, _typehints
    from jsonargparse._util import NestedArg

    original = getattr(_typehints, "subclass_spec_as_namespace", None)
    if original is None or getattr(original, "keeps_nested_nulls", False):
        return

    @functools.wraps(original)
    def subclass_spec_as_namespace(*args, **kwargs):
        spec = original(*args, **kwargs)
        init_args = spec.get("init_args") if isinstance(spec, Namespace) else None
        if isinstance(init_args, NestedArg) and init_args.val is None:
            spec["init_args"] = NestedArg(key=init_args.key, val="null")
        return spec

    subclass_spec_as_namespace.keeps_nested_nulls = True
    _typehints.subclass_spec_as_namespace = subclass_spec_as_namespace
