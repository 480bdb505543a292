"""Model artifacts: TorchScript files, ``torch.export`` programs, or a ``module:factory`` plus
a state_dict, loaded from their bytes onto a device.

The format is read from the bytes (all three are zip archives): a torch.export program has
an ``archive_format`` entry, TorchScript a ``code/`` folder and ``constants.pkl``, and a
state_dict (``torch.save``) only ``data.pkl``, which needs a factory to build the module.
"""

from __future__ import annotations

import io
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from eventbus.errors import ModelError

__all__ = [
    "Format",
    "LoadedModel",
    "detect_format",
    "import_ref",
    "load_model",
    "pick_device",
    "read_artifact",
]

Format = Literal["torchscript", "export", "state_dict"]


def read_artifact(path: str | Path, base_dirs: list[str] | None = None) -> bytes:
    """The bytes of an artifact file; a relative path is looked up in ``base_dirs`` first.

    Raises:
        ModelError: the file does not exist or cannot be read.
    """
    p = Path(path)
    if not p.is_absolute():
        for d in [*(base_dirs or []), "."]:
            if (Path(d) / p).exists():
                p = Path(d) / p
                break
    try:
        return p.read_bytes()
    except OSError as exc:
        where = (
            f" (looked in {', '.join(base_dirs)})"
            if base_dirs and not Path(path).is_absolute()
            else ""
        )
        msg = f"model file {str(path)!r} cannot be read: {exc.strerror or exc}{where}; give the path of a TorchScript, torch.export (.pt2) or state_dict file"
        raise ModelError(msg) from None


def detect_format(
    blob: bytes, factory: str | None = None, *, what: str = "the model file"
) -> Format:
    """The artifact's format, read from its zip entries.

    Raises:
        ModelError: the bytes are not a torch artifact, or a state_dict comes without a factory.
    """
    try:
        names = zipfile.ZipFile(io.BytesIO(blob)).namelist()
    except zipfile.BadZipFile:
        msg = (
            f"{what} is not a torch artifact (not a zip archive); save it with torch.export.save, "
            "torch.jit.save, or torch.save(module.state_dict()) with a factory"
        )
        raise ModelError(msg) from None
    if any(n.endswith("archive_format") for n in names):
        return "export"
    if any("/code/" in n for n in names) or any(n.endswith("constants.pkl") for n in names):
        return "torchscript"
    if factory is None:
        msg = f"{what} holds a state_dict (torch.save); give the factory that builds its module: --factory module:attr (or 'factory:' in the step)"
        raise ModelError(msg)
    return "state_dict"


def pick_device(prefer: str | None = None) -> str:
    """``cuda`` when torch sees a GPU (and ``prefer`` does not say ``cpu``), else ``cpu``."""
    import torch

    if prefer == "cpu":
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass
class LoadedModel:
    """A loaded model: ``fn(x) -> y`` on torch tensors, in eval mode, without autograd."""

    fn: Callable[[Any], Any]
    format: Format
    device: str
    input_shape: tuple[int, ...] | None  # one row's shape, when the artifact tells it

    def __call__(self, x: Any) -> Any:
        import torch

        with torch.inference_mode():
            out = self.fn(x.to(self.device, non_blocking=True))
        if isinstance(out, (tuple, list)):
            out = out[0]
        if not isinstance(out, torch.Tensor):
            msg = f"the model returned {type(out).__name__}; a model step needs a tensor (or a tuple whose first item is one)"
            raise ModelError(msg)
        return out.detach().to("cpu")


def import_ref(ref: str, *, what: str) -> Any:
    """The object named ``module:attr``.

    Raises:
        ModelError: the module does not import or has no such attribute.
    """
    import importlib

    module_name, _, attr = ref.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        msg = f"{what} {ref!r} cannot be imported ({exc}); make sure its module is on PYTHONPATH (or beside the pipeline file)"
        raise ModelError(msg) from None
    if not callable(obj):
        msg = f"{what} {ref!r} is {type(obj).__name__}, not callable"
        raise ModelError(msg)
    return obj


def _resolve_factory(ref: str) -> Callable[[], Any]:
    return import_ref(ref, what="model factory")  # type: ignore[no-any-return]


def load_model(
    blob: bytes, *, factory: str | None = None, device: str = "cpu", what: str = "the model file"
) -> LoadedModel:
    """Load an artifact's bytes onto ``device``.

    Raises:
        ModelError: the bytes do not load as a model (the message says why and what to do).
    """
    import torch

    fmt = detect_format(blob, factory, what=what)
    shape: tuple[int, ...] | None = None
    try:
        if fmt == "export":
            ep = torch.export.load(io.BytesIO(blob))
            example = getattr(ep, "example_inputs", None)
            if (
                example
                and example[0]
                and isinstance(example[0][0], torch.Tensor)
                and example[0][0].dim() >= 1
            ):
                shape = tuple(int(d) for d in example[0][0].shape[1:])
            module = ep.module()
            if device != "cpu":
                module = module.to(device)
            fn: Callable[[Any], Any] = module
        elif fmt == "torchscript":
            with warnings.catch_warnings():
                # TorchScript is deprecated in torch 2.9+ but still loads; it is one of the formats we take.
                warnings.simplefilter("ignore", DeprecationWarning)
                script = torch.jit.load(io.BytesIO(blob), map_location=device)  # type: ignore[no-untyped-call]
            script.eval()
            fn = script
        else:
            assert factory is not None
            module = _resolve_factory(factory)()
            if not isinstance(module, torch.nn.Module):
                msg = f"model factory {factory!r} returned {type(module).__name__}; it must return a torch.nn.Module"
                raise ModelError(msg)
            state = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
            module.load_state_dict(state)
            module.eval()
            fn = module.to(device)
    except ModelError:
        raise
    except Exception as exc:  # noqa: BLE001 - torch raises many types; the user needs the reason
        msg = f"{what} does not load as a {fmt} model: {type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
        raise ModelError(msg) from None
    if shape is None:
        shape = _first_linear_input(fn)
    return LoadedModel(fn, fmt, device, shape)


def _first_linear_input(fn: Any) -> tuple[int, ...] | None:
    """One row's shape when the model starts with a Linear layer (its in_features)."""
    try:
        for name, p in fn.named_parameters():
            if name.endswith("weight") and p.dim() == 2:
                return (int(p.shape[1]),)
            return None
    except Exception:  # noqa: BLE001 - not a module: unknown shape
        return None
    return None
