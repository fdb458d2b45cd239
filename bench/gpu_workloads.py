"""The measured workload set: small training (and one inference) jobs on synthetic data.

Each needs only PyTorch, torchvision, timm and transformers (models built from configs, random
weights, random inputs: nothing is downloaded). ``build(name)`` returns a ``step()`` that runs
one iteration and waits for the GPU (``loss.item()``, as a training loop that logs its loss
does), so iterations per second are the job's speed. Used by ``bench/gpu_measure.py``.
"""

from __future__ import annotations

import os

import torch
from torch import nn

DEVICE = os.environ.get("GPU_MEASURE_DEVICE", "cuda")  # "cpu" for a dry run of the harness

# name -> (kind, batch size, what it stands for). The first config of each workload is the one
# measured in pairs; the others are measured alone (a second batch size).
WORKLOADS = {
    "resnet50-b64": ("resnet50", 64, "CNN training, fp32 (TF32 convolutions)"),
    "resnet50-amp-b128": ("resnet50-amp", 128, "CNN training, bf16 autocast"),
    "resnet18-b128": ("resnet18", 128, "small CNN training"),
    "mobilenetv3-b64": ("mobilenetv3", 64, "launch-bound small CNN"),
    "vit-s16-b64": ("vit-s16", 64, "vision transformer (timm), bf16"),
    "effnet-b0-b64": ("effnet-b0", 64, "depthwise CNN (timm)"),
    "gpt-small-b16": ("gpt-small", 16, "6-layer GPT-2 (transformers config), seq 512, bf16"),
    "bert-base-b32": ("bert-base", 32, "BERT-base classifier (transformers config), seq 128"),
    "dlrm-b4096": ("dlrm", 4096, "recommendation: 8 embedding tables of 500k rows + MLPs"),
    "lstm-b64": ("lstm", 64, "2-layer LSTM language model, seq 128"),
    "loader-resnet18-b64": ("loader-resnet18", 64, "CPU preprocessing bound (2 loader workers)"),
    "infer-resnet50-b64": ("infer-resnet50", 64, "inference loop, fp16, no grad"),
    "gpt-large-b8": ("gpt-large", 8, "24-layer GPT-2 (1024 wide), seq 1024, bf16: large memory"),
    # second batch sizes, measured alone
    "resnet50-b16": ("resnet50", 16, "CNN training, fp32, small batch"),
    "resnet18-b32": ("resnet18", 32, "small CNN training, small batch"),
    "gpt-small-b4": ("gpt-small", 4, "6-layer GPT-2, small batch"),
    "dlrm-b512": ("dlrm", 512, "recommendation, small batch"),
    # host-bound: each step waits on the host afterwards (a data pipeline or a simulator that
    # the GPU waits for), so the GPU is busy only part of the time; measured alone, and in pairs
    # where named (``gpu_measure.py --paired``)
    "host30-resnet50-b64": ("host30-resnet50", 64, "CNN training, then 30 ms on the host per step"),
    "host90-resnet50-b64": ("host90-resnet50", 64, "CNN training, then 90 ms on the host per step"),
}
PAIRED = [name for name in WORKLOADS if name not in
          ("resnet50-b16", "resnet18-b32", "gpt-small-b4", "dlrm-b512", "host30-resnet50-b64",
           "host90-resnet50-b64")]


def build(name: str):
    kind, batch, _ = WORKLOADS[name]
    torch.manual_seed(0)
    return _BUILDERS[kind](batch)


def _train_step(model, inputs_fn, loss_fn, amp: bool = False, lr: float = 0.01):
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    model.train()

    def step() -> float:
        inputs, target = inputs_fn()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=amp and DEVICE == "cuda"):
            out = model(inputs)
            loss = loss_fn(out, target)
        loss.backward()
        opt.step()
        return loss.item()
    return step


def _images(batch: int, size: int = 224, classes: int = 1000):
    x = torch.randn(batch, 3, size, size, device=DEVICE)
    y = torch.randint(0, classes, (batch,), device=DEVICE)
    return lambda: (x, y)


def _torchvision(arch: str, amp: bool = False):
    def make(batch: int):
        import torchvision
        model = getattr(torchvision.models, arch)(num_classes=1000).to(DEVICE)
        return _train_step(model, _images(batch), nn.functional.cross_entropy, amp=amp)
    return make


def _timm(arch: str, amp: bool):
    def make(batch: int):
        import timm
        model = timm.create_model(arch, pretrained=False, num_classes=1000).to(DEVICE)
        return _train_step(model, _images(batch), nn.functional.cross_entropy, amp=amp)
    return make


def _gpt(layers: int, width: int, heads: int, seq: int):
    def make(batch: int):
        from transformers import GPT2Config, GPT2LMHeadModel
        config = GPT2Config(n_layer=layers, n_embd=width, n_head=heads, n_positions=seq,
                            vocab_size=32000, bos_token_id=0, eos_token_id=0)
        model = GPT2LMHeadModel(config).to(DEVICE)
        ids = torch.randint(0, config.vocab_size, (batch, seq), device=DEVICE)
        return _train_step(model, lambda: (ids, ids),
                           lambda out, target: _lm_loss(out.logits, target), amp=True, lr=1e-4)
    return make


def _lm_loss(logits, target):
    return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)).float(),
                                       target[:, 1:].reshape(-1))


def _bert(batch: int):
    from transformers import BertConfig, BertForSequenceClassification
    model = BertForSequenceClassification(BertConfig(num_labels=2)).to(DEVICE)
    ids = torch.randint(0, 30522, (batch, 128), device=DEVICE)
    y = torch.randint(0, 2, (batch,), device=DEVICE)
    return _train_step(model, lambda: (ids, y),
                       lambda out, target: nn.functional.cross_entropy(out.logits, target),
                       lr=1e-4)


class _Dlrm(nn.Module):
    def __init__(self, tables: int = 8, rows: int = 500_000, dim: int = 64, dense: int = 13):
        super().__init__()
        self.embeddings = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum")
                                        for _ in range(tables))
        self.bottom = nn.Sequential(nn.Linear(dense, 512), nn.ReLU(), nn.Linear(512, dim))
        self.top = nn.Sequential(nn.Linear(dim * (tables + 1), 1024), nn.ReLU(),
                                 nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1))

    def forward(self, inputs):
        dense, sparse = inputs
        parts = [self.bottom(dense)]
        parts += [table(ids) for table, ids in zip(self.embeddings, sparse)]
        return self.top(torch.cat(parts, dim=1)).squeeze(1)


def _dlrm(batch: int):
    model = _Dlrm().to(DEVICE)
    rows = model.embeddings[0].num_embeddings

    def inputs():
        dense = torch.randn(batch, 13, device=DEVICE)
        sparse = [torch.randint(0, rows, (batch, 20), device=DEVICE) for _ in model.embeddings]
        return (dense, sparse), torch.rand(batch, device=DEVICE)
    return _train_step(model, inputs, nn.functional.binary_cross_entropy_with_logits)


class _Lstm(nn.Module):
    def __init__(self, vocab: int = 10_000, width: int = 1024):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.lstm = nn.LSTM(width, width, num_layers=2, batch_first=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids):
        out, _ = self.lstm(self.embed(ids))
        return self.head(out)


def _lstm(batch: int):
    model = _Lstm().to(DEVICE)
    ids = torch.randint(0, 10_000, (batch, 128), device=DEVICE)
    return _train_step(model, lambda: (ids, ids),
                       lambda logits, target: nn.functional.cross_entropy(
                           logits.reshape(-1, logits.size(-1)), target.reshape(-1)))


class _RandomImages(torch.utils.data.Dataset):
    """Random 256x256 uint8 images, cropped, flipped and normalised on the CPU."""

    def __len__(self):
        return 1 << 30

    def __getitem__(self, index):
        from torchvision.transforms import v2
        g = torch.Generator().manual_seed(index)
        image = torch.randint(0, 256, (3, 256, 256), dtype=torch.uint8, generator=g)
        transform = v2.Compose([v2.RandomResizedCrop(224, antialias=True),
                                v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32, scale=True),
                                v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
        return transform(image), index % 1000


def _loader_resnet18(batch: int):
    import torchvision
    model = torchvision.models.resnet18(num_classes=1000).to(DEVICE)
    loader = torch.utils.data.DataLoader(_RandomImages(), batch_size=batch, num_workers=2,
                                         pin_memory=True, persistent_workers=True,
                                         prefetch_factor=4)
    batches = iter(loader)

    def inputs():
        x, y = next(batches)
        return x.to(DEVICE, non_blocking=True), y.to(DEVICE, non_blocking=True)
    step = _train_step(model, inputs, nn.functional.cross_entropy)
    step.loader = loader  # keep the workers alive as long as the step
    return step


def _infer_resnet50(batch: int):
    import torchvision
    model = torchvision.models.resnet50(num_classes=1000).to(DEVICE).half().eval()
    x = torch.randn(batch, 3, 224, 224, device=DEVICE, dtype=torch.half)

    @torch.no_grad()
    def step() -> float:
        return model(x).float().mean().item()
    return step


def _host_bound(arch: str, host_ms: float):
    """A training step followed by ``host_ms`` of waiting on the host (the GPU idles)."""
    def make(batch: int):
        import time
        train = _torchvision(arch)(batch)

        def step() -> float:
            loss = train()
            time.sleep(host_ms / 1000.0)
            return loss
        return step
    return make


_BUILDERS = {
    "resnet50": _torchvision("resnet50"),
    "resnet50-amp": _torchvision("resnet50", amp=True),
    "resnet18": _torchvision("resnet18"),
    "mobilenetv3": _torchvision("mobilenet_v3_small"),
    "vit-s16": _timm("vit_small_patch16_224", amp=True),
    "effnet-b0": _timm("efficientnet_b0", amp=False),
    "gpt-small": _gpt(6, 512, 8, 512),
    "gpt-large": _gpt(24, 1024, 16, 1024),
    "bert-base": _bert,
    "dlrm": _dlrm,
    "lstm": _lstm,
    "loader-resnet18": _loader_resnet18,
    "infer-resnet50": _infer_resnet50,
    "host30-resnet50": _host_bound("resnet50", 30),
    "host90-resnet50": _host_bound("resnet50", 90),
}
