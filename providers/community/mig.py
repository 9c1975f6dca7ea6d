"""The MIG (Multi-Instance GPU) profiles a machine's listing may offer, per GPU model.

Facts from NVIDIA's Multi-Instance GPU User Guide, "Supported MIG Profiles"
(https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html): an A100 40GB offers
1g.5gb to 7g.40gb; the 80 GB A100 and the H100 80GB name the same slices after their memory (1g.10gb to
7g.80gb). Media-extension variants (``+me``) are left out: the broker does not sell decoders apart.
"""

from __future__ import annotations

from providers import gpu_names

_A100_40 = ("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")
_80GB = ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")

MIG_PROFILES: dict[str, tuple[str, ...]] = {
    gpu_names.A100_40_SXM: _A100_40,
    gpu_names.A100_40_PCIE: _A100_40,
    gpu_names.A100_80_SXM: _80GB,
    gpu_names.A100_80_PCIE: _80GB,
    gpu_names.H100_SXM: _80GB,
    gpu_names.H100_PCIE: _80GB,
}


def mig_profiles_problem(gpu_model: str, profiles: list[str]) -> str | None:
    """Why ``profiles`` cannot be listed on a ``gpu_model`` machine, or None when they can (none always can)."""
    if not profiles:
        return None
    known = MIG_PROFILES.get(gpu_model)
    if known is None:
        return f"a {gpu_model} is not partitioned with MIG here; leave the profiles empty"
    unknown = [p for p in profiles if p not in known]
    if unknown:
        return f"a {gpu_model} offers {', '.join(known)}; not {', '.join(unknown)}"
    if len(set(profiles)) != len(profiles):
        return "each profile once"
    return None
