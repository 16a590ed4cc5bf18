"""Vision models: CIFAR ResNets (any depth 6n+2), MobileNetV2 for 32x32, the digits CNN, MLPs, ImageNet ResNets.

Plain PyTorch (``nn.Conv2d`` / ``nn.Linear`` / ``nn.BatchNorm2d``); each registers itself in ``registry``.
"""

from __future__ import annotations

import re

import torch
import torch.nn as nn

from cptsim.errors import InputError

from .registry import FP_LAYERS_ATTR, Builder, _Entry, register_model, register_resolver

__all__ = ["cifar_resnet_depths", "CifarResNet", "BasicBlock", "MobileNetV2", "DigitsCNN", "MLP", "TokenMLP"]


# --------------------------------------------------------------------------------------------------------------
# CIFAR ResNet (He et al. 2016, section 4.2): depth 6n+2


def _kaiming_init(model: nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            # fan_out normal = the CPT / SkipNet code's N(0, sqrt(2 / (k*k*out_channels)))
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


class BasicBlock(nn.Module):
    """Two 3x3 convs with an identity shortcut, or a 1x1-conv + BN shortcut where the shape changes."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_planes != planes:
            # A real conv (as in the CPT code, where it is quantized), not the parameter-free option A of He et al.
            self.downsample = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class CifarResNet(nn.Module):
    """conv3x3->16, three stages of n BasicBlocks at 16/32/64 channels, global average pool, ``fc``."""

    def __init__(self, n: int, num_classes: int = 10, in_channels: int = 3):
        super().__init__()
        self.depth = 6 * n + 2
        self.conv1 = nn.Conv2d(in_channels, 16, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = self._stage(16, 16, n, stride=1)
        self.layer2 = self._stage(16, 32, n, stride=2)
        self.layer3 = self._stage(32, 64, n, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, num_classes)
        _kaiming_init(self)

    @staticmethod
    def _stage(in_planes: int, planes: int, n: int, stride: int) -> nn.Sequential:
        blocks = [BasicBlock(in_planes, planes, stride)]
        blocks += [BasicBlock(planes, planes, 1) for _ in range(n - 1)]
        return nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(self.avgpool(x), 1))


_RESNET_RE = re.compile(r"^resnet(\d+)$")
# The depths the CPT paper trains, plus the common small ones; any 6n+2 works.
_RESNET_LISTED = (20, 38, 56, 74, 110, 152, 164)


def cifar_resnet_depths(limit: int = 56) -> list[int]:
    """Valid CIFAR ResNet depths up to ``limit`` (for help text: 8, 14, 20, ...)."""
    return list(range(8, limit + 1, 6))


def _parse_resnet_depth(name: str) -> int | None:
    """n for ``resnet{6n+2}``; None when the name is not of the pattern; InputError for a bad depth."""
    m = _RESNET_RE.match(name)
    if m is None:
        return None
    depth = int(m.group(1))
    if depth < 8 or (depth - 2) % 6 != 0:
        hint = f" (for the ImageNet model use imagenet-{name})" if name in _IMAGENET_RESNETS else ""
        raise InputError(
            f"{name}: a CIFAR ResNet needs depth 6n+2 with n>=1, i.e. "
            f"{', '.join(str(d) for d in cifar_resnet_depths(56))}, ..., 110, 164{hint}"
        )
    return (depth - 2) // 6


def _resnet_entry(name: str, n: int) -> _Entry:
    depth = 6 * n + 2

    def build(num_classes: int, in_channels: int, input_shape=None) -> nn.Module:
        model = CifarResNet(n, num_classes=num_classes, in_channels=in_channels)
        setattr(model, FP_LAYERS_ATTR, ["fc"])
        return model

    return _Entry(
        name,
        build,
        family="cifar-resnet",
        input="cifar",
        description=f"CIFAR ResNet-{depth} (He et al.): 3 stages x {n} BasicBlocks at 16/32/64 channels, "
        f"1x1-conv downsample",
    )


# --------------------------------------------------------------------------------------------------------------
# MobileNetV2 for 32x32 input


class InvertedResidual(nn.Module):
    """1x1 expand (skipped at t=1) -> 3x3 depthwise -> 1x1 linear projection; residual when shapes match."""

    def __init__(self, in_planes: int, out_planes: int, stride: int, expansion: int):
        super().__init__()
        hidden = in_planes * expansion
        self.use_residual = stride == 1 and in_planes == out_planes
        layers: list[nn.Module] = []
        if expansion != 1:
            layers += [nn.Conv2d(in_planes, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(inplace=True)]
        layers += [
            nn.Conv2d(hidden, hidden, 3, stride=stride, padding=1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU6(inplace=True),
            nn.Conv2d(hidden, out_planes, 1, bias=False),
            nn.BatchNorm2d(out_planes),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv(x)
        return x + out if self.use_residual else out


class MobileNetV2(nn.Module):
    # (expansion t, out channels c, blocks n, first stride s) from Sandler et al. Table 2, with the usual CIFAR
    # changes: stem stride 1 and the second stage's stride 1 (32x32 input would otherwise shrink to 1x1).
    CFG = [(1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]

    def __init__(self, num_classes: int = 10, in_channels: int = 3):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 32, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        blocks: list[nn.Module] = []
        in_planes = 32
        for t, c, n, s in self.CFG:
            for i in range(n):
                blocks.append(InvertedResidual(in_planes, c, s if i == 0 else 1, t))
                in_planes = c
        self.layers = nn.Sequential(*blocks)
        self.conv2 = nn.Conv2d(320, 1280, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(1280)
        self.relu = nn.ReLU6(inplace=True)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(1280, num_classes)
        _kaiming_init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layers(x)
        x = self.relu(self.bn2(self.conv2(x)))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# --------------------------------------------------------------------------------------------------------------
# Small models for the sklearn digits set and for tests


class DigitsCNN(nn.Module):
    """Three 3x3 convs (32, 64, 64) with one 2x2 max-pool, global average pool, ``fc``: ~56k params, 8x8 input."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1, bias=False),
            nn.BatchNorm2d(32),
            nn.ReLU(inplace=True),
            nn.Conv2d(32, 64, 3, padding=1, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 3, padding=1, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
        )
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, num_classes)
        _kaiming_init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.avgpool(self.features(x)), 1))


class MLP(nn.Module):
    """Flatten -> Linear(in, 256) -> ReLU -> Linear(256, 256) -> ReLU -> ``fc``."""

    def __init__(self, in_features: int, num_classes: int = 10, hidden: int = 256):
        super().__init__()
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.relu = nn.ReLU(inplace=True)
        self.fc = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.fc1(self.flatten(x)))
        return self.fc(self.relu(self.fc2(x)))


class TokenMLP(nn.Module):
    """Linear layers on the last dim of a (B, T, F) input, mean over T, then ``fc``.

    Exists so that "Linear on N-D input" (the shape transformers give Linear) is exercised. Any input whose last
    dim is F works: (B, C, H, W) with W == F is read as B x (C*H) tokens of F features.
    """

    def __init__(self, features: int, num_classes: int = 10, hidden: int = 64):
        super().__init__()
        self.features = features
        self.fc1 = nn.Linear(features, hidden)
        self.relu = nn.ReLU(inplace=True)
        self.fc2 = nn.Linear(hidden, features)
        self.fc = nn.Linear(features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(x.shape[0], -1, self.features)
        x = self.fc2(self.relu(self.fc1(x)))
        return self.fc(x.mean(dim=1))


def _need_shape(name: str, input_shape) -> tuple[int, ...]:
    if input_shape is None:
        raise InputError(f"{name} needs input_shape (e.g. (1, 8, 8)); the CLI takes it from the dataset")
    shape = tuple(int(s) for s in input_shape)
    if not shape or any(s < 1 for s in shape):
        raise InputError(f"{name}: input_shape must be positive sizes, got {tuple(input_shape)}")
    return shape


@register_model("mobilenetv2", family="mobilenetv2", input="cifar",
                description="MobileNetV2 for 32x32 input (stem and second stage at stride 1), width 1.0")
def _mobilenetv2(num_classes: int, in_channels: int, input_shape=None) -> nn.Module:
    model = MobileNetV2(num_classes=num_classes, in_channels=in_channels)
    setattr(model, FP_LAYERS_ATTR, ["fc"])
    return model


@register_model("digits-cnn", family="small-cnn", input="digits",
                description="3-conv CNN (32/64/64 channels, one max-pool) for 8x8 sklearn digits, ~56k params")
def _digits_cnn(num_classes: int, in_channels: int, input_shape=None) -> nn.Module:
    model = DigitsCNN(num_classes=num_classes, in_channels=in_channels)
    setattr(model, FP_LAYERS_ATTR, ["fc"])
    return model


@register_model("mlp", family="mlp", input="any",
                description="Flatten -> 256 -> 256 -> classes MLP; needs input_shape")
def _mlp(num_classes: int, in_channels: int, input_shape=None) -> nn.Module:
    shape = _need_shape("mlp", input_shape)
    numel = 1
    for s in shape:
        numel *= s
    model = MLP(numel, num_classes=num_classes)
    setattr(model, FP_LAYERS_ATTR, ["fc"])
    return model


@register_model("token-mlp", family="mlp", input="any",
                description="Linear(F->64)->ReLU->Linear(64->F) on (B, T, F), mean over T, fc; F = input_shape[-1]")
def _token_mlp(num_classes: int, in_channels: int, input_shape=None) -> nn.Module:
    shape = _need_shape("token-mlp", input_shape)
    model = TokenMLP(shape[-1], num_classes=num_classes)
    setattr(model, FP_LAYERS_ATTR, ["fc"])
    return model


# --------------------------------------------------------------------------------------------------------------
# ImageNet ResNets (torchvision)

_IMAGENET_RESNETS = {"resnet18": "resnet18", "resnet34": "resnet34", "resnet50": "resnet50"}


def _imagenet_resnet(arch: str) -> Builder:
    def build(num_classes: int, in_channels: int, input_shape=None) -> nn.Module:
        import torchvision

        model = getattr(torchvision.models, arch)(weights=None, num_classes=num_classes)
        if in_channels != 3:
            model.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
            nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
        # CPT's ImageNet convention: first conv, every downsample conv and the classifier stay full precision.
        downsample = [
            name for name, m in model.named_modules() if name.endswith("downsample.0") and isinstance(m, nn.Conv2d)
        ]
        setattr(model, FP_LAYERS_ATTR, ["conv1", *downsample, "fc"])
        return model

    return build


for _short, _arch in _IMAGENET_RESNETS.items():
    register_model(
        f"imagenet-{_short}",
        family="imagenet-resnet",
        input="imagenet",
        description=f"torchvision {_arch} (random init), 224x224 input",
    )(_imagenet_resnet(_arch))


def _resolve_resnet(key: str) -> _Entry | None:
    n = _parse_resnet_depth(key)
    return None if n is None else _resnet_entry(key, n)


register_resolver(_resolve_resnet, listed=tuple(f"resnet{d}" for d in _RESNET_LISTED))
