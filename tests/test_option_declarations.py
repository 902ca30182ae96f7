"""An option's help and domain are declared beside it (`Annotated[T, Option(help, domain)]`): the checks and
`--help` read them from there, for an option group's field and for an `__init__` argument alike."""

import dataclasses
import importlib
import inspect
import pkgutil
import typing
from typing import Annotated

import pytest
from jsonargparse import ArgumentParser

import rlvr_lightning
from rlvr_lightning.modules import RLVRModule
from rlvr_lightning.modules.options import AggregationConfig, UpdateConfig
from rlvr_lightning.policies import HFPolicy
from rlvr_lightning.runtime.option_declarations import (
    Option,
    check_options,
    declared_domains,
    declared_options,
    documented_options,
)
from rlvr_lightning.runtime.option_domains import POSITIVE_INT, OneOf, OptionValueError, Range


@documented_options
@dataclasses.dataclass(frozen=True)
class Group:
    """A group."""

    size: Annotated[int, Option("rows per step.", POSITIVE_INT)] = 1
    name: Annotated[str, Option("which one.", OneOf(("a", "b")))] = "a"
    free: Annotated[bool, Option("anything.")] = True


class Base:
    def __init__(self, width: Annotated[float, Option("the width.", Range(0, low_open=True))] = 1.0) -> None:
        check_options(Base, locals())


@documented_options
class Derived(Base):
    def __init__(self, group: Annotated[Group, Option("the group.")] = Group(), **kwargs) -> None:
        """
        Args:
            kwargs: as in Base.
        """
        check_options(Derived, locals())
        super().__init__(**kwargs)


def test_a_field_and_an_argument_declare_their_help_and_domain_alike():
    assert declared_options(Group) == {
        "size": Option("rows per step.", POSITIVE_INT),
        "name": Option("which one.", OneOf(("a", "b"))),
        "free": Option("anything."),
    }
    assert declared_domains(Group) == {"size": POSITIVE_INT, "name": OneOf(("a", "b"))}
    assert set(declared_options(Derived)) == {"width", "group"}  # a base's arguments too


def test_check_options_names_the_option_the_value_and_the_domain():
    with pytest.raises(OptionValueError, match=r"^g\.size=0 is not valid: must be an integer >= 1$"):
        check_options(Group, {"size": 0}, "g.")
    with pytest.raises(ValueError, match=r"^name='c' is not valid; choose one of \['a', 'b'\]$"):
        check_options(Group, {"name": "c", "free": object()})
    with pytest.raises(OptionValueError, match=r"^width=0 is not valid: must be a finite number > 0$"):
        Derived(width=0)
    with pytest.raises(OptionValueError, match=r"^update\.epochs=0 is not valid"):
        UpdateConfig(epochs=0)
    with pytest.raises(ValueError, match=r"^aggregation\.mode='mean' is not valid; choose one of"):
        AggregationConfig(mode="mean")
    check_options(Group, {"size": 3, "name": "b", "unknown": -1})


def test_the_help_reaches_the_docstring_and_the_parser():
    assert "size: rows per step." in Group.__doc__
    doc = inspect.cleandoc(Derived.__init__.__doc__)
    assert "group: the group." in doc and "kwargs: as in Base." in doc
    parser = ArgumentParser()
    parser.add_class_arguments(RLVRModule, "model", sub_configs=True)
    text = parser.format_help()
    for help_text in ("responses sampled per prompt.", "passes over the rollout (PPO epochs).", "(GRPO) | token-mean"):
        assert help_text in " ".join(text.split()), help_text
    hf = ArgumentParser()
    hf.add_class_arguments(HFPolicy, "policy")
    assert "the LoRA rank (0: no LoRA" in " ".join(hf.format_help().split())


def _package_classes():
    for info in pkgutil.walk_packages(rlvr_lightning.__path__, "rlvr_lightning."):
        if info.name.endswith("__main__"):
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional dependency (vLLM, ...) is missing
            continue
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == info.name:
                yield cls


def test_every_class_that_declares_options_shows_their_help():
    """A class whose own options are declared so is `@documented_options`: else `--help` would not show them."""
    undocumented = []
    for cls in _package_classes():
        target = cls if dataclasses.is_dataclass(cls) else vars(cls).get("__init__")
        hints = (
            typing.get_type_hints(target, include_extras=True) if inspect.isfunction(target) or target is cls else {}
        )
        own = {
            name: item
            for name, hint in hints.items()
            for item in getattr(hint, "__metadata__", ())
            if isinstance(item, Option)
        }
        doc = inspect.cleandoc(getattr(target, "__doc__", None) or "")
        missing = [name for name, option in own.items() if f"{name}: {option.help}" not in doc]
        if missing:
            undocumented.append(f"{cls.__module__}.{cls.__qualname__}: {missing}")
    assert not undocumented
