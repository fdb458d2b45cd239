import pytest

from slurm_gpushare.core.config import GpuType
from slurm_gpushare.core.gpus import UnknownGpu, default_catalogue
from slurm_gpushare.predict.datasets import SCHEDTUNE_GPUS, load_schedtune

REQUIRED = ["K80", "P100", "V100-16GB", "V100-32GB", "T4", "A10", "A30", "A40", "A100-40GB",
            "A100-80GB", "L4", "L40S", "H100", "H200", "RTX2070S", "RTX3070", "RTX3090",
            "RTX4090"]


def test_catalogue_has_the_required_models_with_sane_facts():
    cat = default_catalogue()
    assert set(REQUIRED) <= set(cat.models)
    for spec in cat:
        assert spec.source, spec.model
        assert spec.cuda_cores > 0 and spec.sm_count > 0 and spec.memory_gib > 0
        # CUDA cores per SM: 192 (Kepler), 64 (GP100, Volta, Turing, GA100), 128 (others).
        assert spec.cuda_cores / spec.sm_count in (64, 128, 192), spec.model
        # Tensor cores arrived with Volta (compute capability 7.0).
        assert (spec.tensor_cores > 0) == (spec.cc >= 7.0), spec.model
        if spec.tensor_cores:  # 8 per SM on Volta/Turing, 4 from Ampere on
            assert spec.tensor_cores / spec.sm_count == (8 if spec.cc < 8 else 4), spec.model
        assert 0 <= spec.ecc_reserved_fraction < 0.1
    assert cat.lookup("H100").memory_bandwidth_gbs > cat.lookup("A100-80GB").memory_bandwidth_gbs
    assert cat.lookup("K80").usable_mib == pytest.approx(12 * 1024 * 15 / 16)


def test_catalogue_agrees_with_the_schedtune_characteristics():
    cat = default_catalogue()
    frame = load_schedtune().drop_duplicates("cuda_cores")
    for row in frame.itertuples():
        spec = cat.lookup(SCHEDTUNE_GPUS[row.cuda_cores])
        assert (spec.cuda_cores, spec.sm_count, spec.tensor_cores) == (
            row.cuda_cores, row.sm_count, row.tensor_cores)
        if spec.model != "RTX3070":  # SchedTune lists 512 GB/s; NVIDIA says 448 GB/s
            assert spec.memory_bandwidth_gbs == pytest.approx(row.memory_bandwidth_gbs, rel=0.01)


@pytest.mark.parametrize("name,memory,model", [
    ("v100", 16, "V100-16GB"),
    ("v100", 32, "V100-32GB"),
    ("Tesla V100-SXM2-16GB", None, "V100-16GB"),
    ("NVIDIA A100-SXM4-80GB", None, "A100-80GB"),
    ("NVIDIA A100 80GB PCIe", None, "A100-80GB"),
    ("a100", 40, "A100-40GB"),
    ("a100", 79, "A100-80GB"),
    ("NVIDIA GeForce RTX 2070 SUPER", None, "RTX2070S"),
    ("NVIDIA H100 80GB HBM3", None, "H100"),
    ("Tesla K80", None, "K80"),
    ("NVIDIA A10", None, "A10"),
])
def test_lookup_by_nvml_names_and_aliases(name, memory, model):
    assert default_catalogue().lookup(name, memory_gib=memory).model == model


def test_ambiguous_and_unknown_names_are_errors():
    cat = default_catalogue()
    with pytest.raises(UnknownGpu, match="ambiguous"):
        cat.lookup("a100")
    with pytest.raises(UnknownGpu, match="unknown GPU model"):
        cat.lookup("Voodoo 5")


def test_config_gpu_types_of_the_test_cluster_resolve():
    cat = default_catalogue()
    assert cat.for_gpu_type(GpuType("v100", 16, model="V100-16GB")).model == "V100-16GB"
    assert cat.for_gpu_type(GpuType("a100", 80, model="A100-80GB")).model == "A100-80GB"
    assert cat.for_gpu_type(GpuType("a100", 40)).model == "A100-40GB"
