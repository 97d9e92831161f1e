"""The profiled model's description, as the analytic profiler recorded it (schema.ModelInfo.architecture: the
ModelSpec's non-default fields), for the exports that build the same model in another stack."""

from __future__ import annotations

from ..io import InputError
from ..models.spec import ModelSpec
from ..schema import Profile


def spec_of(profile: Profile, where: str) -> ModelSpec | None:
    """The profiled model's ModelSpec; None where the profile records none: a measured profile (a model file) or the
    Megatron GPT (family 'gpt', Megatron's default model). An analytic decoder-family profile written before lynx
    recorded architectures is an InputError: exporting it would guess the model."""
    arch = profile.model.architecture
    if arch is None:
        if "family" in profile.model.config:
            raise InputError(f"{where}: field model.architecture: the profile does not record its model's "
                             "architecture (made before lynx recorded it): re-run `lynx profile` and `lynx plan` to "
                             "export it")
        return None
    return ModelSpec.model_validate(arch)


def unknown_fields(profile: Profile, handled: set[str], moe_handled: set[str], target: str, where: str) -> None:
    """An InputError naming the architecture fields (set to other than their defaults) an export to `target` does not
    express: a field added for a new feature must be handled there before its models export."""
    arch = profile.model.architecture or {}
    unknown = sorted(set(arch) - handled) + sorted(f"moe.{k}" for k in set(arch.get("moe") or {}) - moe_handled)
    if unknown:
        values = [arch[k] if "." not in k else arch["moe"][k[4:]] for k in unknown]
        shown = [r if len(r := repr(v)) <= 40 else r[:37] + "..." for v in values]  # a per-layer list: its start
        raise InputError(f"{where}: field model.architecture: {', '.join(unknown)} ({', '.join(shown)}): "
                         f"lynx's {target} export does not express it; not exporting a different model")
