"""Image-classification spaces (``task: image-classification``): a vision Transformer over a square grid of patches.

The model cuts the image (at the subnet's input ``resolution``, resized when it differs from the data's) into
``patch`` x ``patch`` patches, embeds each (``stem``: ``linear``, a linear map of the patch's pixels; ``conv``, a
3 x 3 convolution of ``stem_channels`` channels then the linear map; ``cct``, CCT's convolutional tokenizer: the 3 x 3
convolution, ReLU and a 3 x 3 max-pool of stride 2, then the linear map of each ``patch / 2`` x ``patch / 2`` patch of
the pooled map, so the grid is the same), adds 2D positions (a learned row and a learned column embedding) and runs
the elastic encoder blocks (bidirectional attention) over the **row-major grid** of ``S x S`` tokens
(``S = resolution / patch``, ``T = S * S``; token ``t`` is row ``t // S``, column ``t % S``), then a final norm, a
pooling (``pool``: ``mean`` over the tokens; ``seq``, CCT's sequence pooling: a softmax over the tokens of a learned
linear score, the tokens' weighted sum; ``cls``, a learned class token put before the grid, whose output is read:
T + 1 tokens, so not with the 2D types, which read a square grid) and a linear head.  The format (``vision-tiny.yaml``
is annotated)::

    task: image-classification
    image: {size: 28, channels: 1, classes: 10}
    resolution: [28]         # input resolutions (tokens grow with it); each a multiple of every patch size
    patch: [4, 7]            # patch sizes
    stem: [linear, conv]     # patch embeddings (linear, conv, cct)
    stem_channels: 16        # the conv and cct stems' channels (a fixed choice)
    pool: [mean]             # poolings (mean, seq, cls; optional, default mean)
    head_dim: 16
    embed_dim: [...]
    depth: [...]
    layers: {heads: [...], ffn_dim: [...], attention: [...]}   # the types with a bidirectional form
    keep: [1.0, 0.7, 0.5]    # optional: per layer, the share of tokens the block runs (token keeping, .tokens)
    latency: {image: {batch_size: 1}}                          # one image (and a batch the user names)

The genes beyond the one-stack ones are the subnet's ``resolution``, ``patch``, ``stem``, (when the space lists more
than one) ``pool`` and (where the space lists ``keep``) each layer's token share (:mod:`.tokens`); the one-stack part
is a :class:`~search_spaces.space.Space` (``max_seq_len`` the most tokens, ``(max resolution / min patch)^2``, one more
with ``cls``), so the elastic blocks and the attention-type checks are the one-stack ones.  A space of one pooling,
``mean``, writes no ``pool`` and encodes no pooling feature, and one without ``keep`` no share: spaces, subnets, hashes
and feature vectors from before pooling and token keeping were choices read the same.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from search_spaces.attention import grid_problems, parse_attention
from search_spaces.errors import SpaceError, SubnetError, UserError, shown
from search_spaces.space import Checker, Space, Subnet, is_int, parse_stack

from . import tokens as tk

TASK = "image-classification"
IMAGE = "image"  # the workload kind: one forward pass over batch_size images
STEMS = ("linear", "conv", "cct")
POOLS = ("mean", "seq", "cls")


# --------------------------------------------------------------------------- subnet


@dataclass(frozen=True)
class VisionSubnet(Subnet):
    """A one-stack subnet plus the image genes: input ``resolution``, ``patch`` size, patch-embedding ``stem``, ``pool``
    and each layer's token share ``keep`` (() when every layer keeps every token: :mod:`.tokens`)."""

    resolution: int
    patch: int
    stem: str
    pool: str = "mean"
    keep: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("resolution", "patch"):
            if not is_int(getattr(self, name)) or getattr(self, name) < 1:
                raise SubnetError(f"subnet.{name}: {shown(getattr(self, name))} is not a positive integer")
        if self.stem not in STEMS:
            raise SubnetError(f"subnet.stem: {shown(self.stem)} is not one of {', '.join(STEMS)}")
        if self.pool not in POOLS:
            raise SubnetError(f"subnet.pool: {shown(self.pool)} is not one of {', '.join(POOLS)}")
        try:
            object.__setattr__(self, "keep", tk.check_keep(self.keep, self.depth))
        except ValueError as e:
            raise SubnetError(str(e)) from None

    @property
    def keeps(self) -> tuple[float, ...]:
        """Every layer's token share of the grid (1.0: the whole grid)."""
        return tk.layer_keeps(self.keep, self.depth)

    @property
    def grid(self) -> int:
        """S: the tokens are an S x S grid (row-major)."""
        return self.resolution // self.patch

    @property
    def tokens(self) -> int:
        """The patch tokens: the S x S grid."""
        return self.grid**2

    @property
    def seq_len(self) -> int:
        """The tokens the blocks see: the grid, and the class token with ``pool: cls``."""
        return self.tokens + (self.pool == "cls")

    def stack(self) -> Subnet:
        """The one-stack part."""
        return Subnet(self.embed_dim, self.depth, self.heads, self.ffn_dim, self.attention)

    def to_dict(self) -> dict[str, Any]:
        pool = {"pool": self.pool} if self.pool != "mean" else {}  # (none for mean: keys and hashes as before)
        keep = {"keep": list(self.keep)} if self.keep else {}  # (absent when every layer keeps all: keys as before)
        return {"resolution": self.resolution, "patch": self.patch, "stem": self.stem, **pool, **super().to_dict(), **keep}

    @classmethod
    def from_dict(cls, data: Any, where: str = "subnet") -> "VisionSubnet":
        extra = ("resolution", "patch", "stem")
        if not isinstance(data, dict) or any(k not in data for k in extra):
            raise SubnetError(f"{where}: expected a mapping with keys {', '.join(extra)}, embed_dim, depth, heads, ffn_dim, "
                              f"attention (an image-classification subnet), got {shown(data)}")
        keep = data.get("keep", [])
        if not isinstance(keep, list):
            raise SubnetError(f"{where}.keep: expected a list of token shares, one per layer, got {shown(keep)}")
        stack = Subnet.from_dict({k: v for k, v in data.items() if k not in (*extra, "pool", "keep")}, where)
        try:
            return cls(**{f.name: getattr(stack, f.name) for f in fields(Subnet)},
                       **{k: data[k] for k in extra}, pool=data.get("pool", "mean"), keep=tuple(keep))
        except SubnetError as e:
            raise SubnetError(str(e).replace("subnet", where, 1)) from None

    def __str__(self) -> str:
        pool = f" {self.pool}-pool" if self.pool != "mean" else ""
        keep = f" keep {'/'.join(f'{v:g}' for v in self.keep)}" if self.keep else ""
        return f"{self.resolution}px p{self.patch} {self.stem}{pool} {super().__str__()}{keep}"


# --------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class ImageWorkload:
    """One forward pass over ``batch_size`` images of the data's size (the model resizes to its resolution)."""

    name: str
    batch_size: int
    kind: str = IMAGE

    @property
    def shape(self) -> str:
        return f"{self.batch_size} image{'s' * (self.batch_size > 1)}"

    @property
    def label(self) -> str:
        return f"{self.name}:{self.batch_size}img"

    def __str__(self) -> str:
        return f"{self.name} (image, batch {self.batch_size})"

    def to_dict(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size} if self.name == IMAGE else {"kind": IMAGE, "batch_size": self.batch_size}

    def record(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "batch_size": self.batch_size}

    @classmethod
    def from_record(cls, data: dict, where: str = "workload") -> "ImageWorkload":
        try:
            return cls(str(data["name"]), int(data["batch_size"]))
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(f"{where}: not an image workload record (name, batch_size): {e!r}") from None


# --------------------------------------------------------------------------- space


@dataclass(frozen=True)
class VisionSpace(Space):
    """A one-stack space (the blocks' choices) plus the image facts and genes."""

    image_size: int = 28
    channels: int = 1
    classes: int = 10
    resolutions: tuple[int, ...] = (28,)
    patches: tuple[int, ...] = (4,)
    stems: tuple[str, ...] = ("linear",)
    stem_channels: int = 16
    pools: tuple[str, ...] = ("mean",)
    flip: bool = True  # the training augmentation flips horizontally (clothes; not digits)
    pad: int = 2  # and crops at random from the image padded by this many pixels
    keeps: tuple[float, ...] = (1.0,)  # token shares a layer may keep (.tokens; (1.0,): no token keeping)

    subnet_type = VisionSubnet

    def require_one_stack(self, command: str) -> None:
        raise UserError(f"{self.source}: task {TASK}: `nas {command}` does not run image-classification spaces (docs/vision.md "
                        "lists the commands that do)")

    # -- members ------------------------------------------------------------------

    def _vision(self, s: Subnet, resolution: int, patch: int, stem: str, pool: str | None = None,
                keep: tuple[float, ...] = ()) -> VisionSubnet:
        return VisionSubnet(s.embed_dim, s.depth, s.heads, s.ffn_dim, s.attention, resolution, patch, stem,
                            self.pools[0] if pool is None else pool, keep)

    @property
    def image_genes(self) -> tuple[tuple[str, tuple], ...]:
        """(name, choices) of the image genes; ``pool`` only when the space lists more than one (a space of one pooling
        draws, mutates and encodes as before pooling was a choice).  Each layer's token share is drawn apart
        (:mod:`.tokens`: a 2D layer keeps every token)."""
        genes = (("resolution", self.resolutions), ("patch", self.patches), ("stem", self.stems))
        return genes + ((("pool", self.pools),) if len(self.pools) > 1 else ())

    def _fewest(self, attention: tuple[str, ...]) -> tuple[float, ...]:
        """The smallest share on every layer that may keep fewer tokens (a 2D layer keeps all)."""
        return tk.check_keep(tuple(tk.FULL if tk.reads_grid(a) else min(self.keeps) for a in attention), len(attention))

    def largest(self, attention: str | None = None) -> VisionSubnet:
        """The widest, deepest subnet with the most tokens (highest resolution, smallest patch, every token kept) and the
        last stem and pooling listed (``conv`` when there is one: the costlier)."""
        return self._vision(super().largest(attention), max(self.resolutions), min(self.patches), self.stems[-1],
                            self.pools[-1])

    def smallest(self, attention: str | None = None) -> VisionSubnet:
        """The narrowest, shallowest subnet with the fewest tokens (the smallest share kept) and the first stem and
        pooling listed."""
        s = super().smallest(attention)
        return self._vision(s, min(self.resolutions), max(self.patches), self.stems[0], keep=self._fewest(s.attention))

    def uniform(self) -> list[VisionSubnet]:
        """Every hand-scaled ViT: the one-stack uniform grid at every resolution, patch, stem and pooling."""
        return [self._vision(s, r, p, st, pl) for s in super().uniform() for r in self.resolutions for p in self.patches
                for st in self.stems for pl in self.pools]

    def sample(self, rng: np.random.Generator) -> VisionSubnet:
        r, p, st = (int(rng.choice(self.resolutions)), int(rng.choice(self.patches)),
                    self.stems[int(rng.integers(len(self.stems)))])
        pool = self.pools[int(rng.integers(len(self.pools)))] if len(self.pools) > 1 else None
        s = super().sample(rng)
        return self._vision(s, r, p, st, pool, tk.check_keep(tk.draw_keep(self.keeps, s.attention, rng), s.depth))

    def lightest(self) -> list[VisionSubnet]:
        return [self._vision(s, min(self.resolutions), max(self.patches), self.stems[0],
                             keep=self._fewest(s.attention)) for s in super().lightest()]

    def mutate(self, parent: VisionSubnet, rng: np.random.Generator, prob: float) -> VisionSubnet:
        genes = {name: getattr(parent, name) for name, _ in self.image_genes}
        for name, choices in self.image_genes:
            if rng.random() < prob:
                genes[name] = choices[int(rng.integers(len(choices)))]
        s = super().mutate(parent.stack(), rng, prob)
        keep = tk.mutate_keep(self.keeps, parent.keeps, s.attention, rng, prob)
        return self._vision(s, **genes, keep=tk.check_keep(keep, s.depth))

    def crossover(self, a: VisionSubnet, b: VisionSubnet, rng: np.random.Generator) -> VisionSubnet:
        genes = {name: getattr((a, b)[int(rng.integers(2))], name) for name, _ in self.image_genes}
        s = super().crossover(a.stack(), b.stack(), rng)
        keep = tk.cross_keep(self.keeps, a.keep, b.keep, a.depth, b.depth, s.attention, rng)
        return self._vision(s, **genes, keep=tk.check_keep(keep, s.depth))

    def genes(self, subnet: VisionSubnet) -> dict[str, tuple[Any, tuple]]:
        keep = {f"l{i}.keep": (v, self.keeps) for i, v in enumerate(subnet.keeps)} if len(self.keeps) > 1 else {}
        return {**{name: (getattr(subnet, name), choices) for name, choices in self.image_genes}, **super().genes(subnet),
                **keep}

    def problems(self, subnet: VisionSubnet) -> list[str]:
        if not isinstance(subnet, VisionSubnet):
            return [f"expected an image-classification subnet (resolution, patch, stem, layers), got {type(subnet).__name__}"]
        out = []
        for name, value, choices in (("resolution", subnet.resolution, self.resolutions), ("patch", subnet.patch, self.patches),
                                     ("stem", subnet.stem, self.stems), ("pool", subnet.pool, self.pools)):
            if value not in choices:
                out.append(f"{name}: {shown(value)} is not one of {', '.join(map(str, choices))}")
        return out + super().problems(subnet) + tk.keep_problems(self.keeps, subnet.attention, subnet.keep)

    def size(self) -> int:
        grid = sum(tk.reads_grid(a) for a in self.attention)  # a 2D layer has one share, the others each of keeps
        per_layer = len(self.heads) * len(self.ffn_dim) * (grid + (len(self.attention) - grid) * len(self.keeps))
        stack = len(self.embed_dim) * sum(per_layer**d for d in self.depth)
        return stack * len(self.resolutions) * len(self.patches) * len(self.stems) * len(self.pools)

    # -- features -----------------------------------------------------------------

    @property
    def _pool_features(self) -> tuple[str, ...]:
        """The poolings one-hot encoded: none for a space of the mean alone (its vectors as before)."""
        return self.pools if self.pools != ("mean",) else ()

    def feature_names(self) -> list[str]:
        return ["resolution", "patch", "tokens", *(f"stem={s}" for s in self.stems),
                *(f"pool={p}" for p in self._pool_features), *super().feature_names(),
                *tk.keep_feature_names(self.keeps, self.max_depth)]

    def encode(self, subnet: VisionSubnet) -> np.ndarray:
        self.check(subnet)
        head = [subnet.resolution, subnet.patch, subnet.tokens, *(float(subnet.stem == s) for s in self.stems),
                *(float(subnet.pool == p) for p in self._pool_features)]
        keep = tk.keep_features(self.keeps, subnet.keep, subnet.depth, self.max_depth)
        return np.concatenate([np.array(head, dtype=np.float64), super().encode(subnet), np.array(keep, dtype=np.float64)])

    def decode(self, vec: np.ndarray) -> VisionSubnet:
        vec = np.asarray(vec, dtype=np.float64)
        n_stem = 3 + len(self.stems)
        n = n_stem + len(self._pool_features)
        if vec.ndim != 1 or len(vec) < n:
            raise SubnetError(f"feature vector has shape {vec.shape}, space {self.name!r} expects ({len(self.feature_names())},)")
        n_keep = len(tk.keep_feature_names(self.keeps, self.max_depth))
        rest, n_att = vec[n : len(vec) - n_keep], len(self.attention)
        if len(rest) != 2 + self.max_depth * (3 + n_att):
            raise SubnetError(f"feature vector has shape {vec.shape}, space {self.name!r} expects ({len(self.feature_names())},)")
        depth, layers = int(round(rest[1])), []
        for i in range(depth):
            base = 2 + i * (3 + n_att)
            layers.append((int(round(rest[base + 1])), int(round(rest[base + 2])),
                           self.attention[int(np.argmax(rest[base + 3 : base + 3 + n_att]))]))
        stack = Subnet(int(round(rest[0])), depth, *(tuple(x) for x in zip(*layers))) if layers else None
        if stack is None:
            raise SubnetError(f"feature vector of depth {depth}: not a subnet of space {self.name!r}")
        stem = self.stems[int(np.argmax(vec[3:n_stem]))]
        pool = self._pool_features[int(np.argmax(vec[n_stem:n]))] if self._pool_features else None
        keep = tuple(float(v) for v in vec[len(vec) - n_keep :][:depth]) if n_keep else ()
        try:
            keep = tk.check_keep(keep, depth)
        except ValueError as e:
            raise SubnetError(f"feature vector: {e}") from None
        return self.check(self._vision(stack, int(round(vec[0])), int(round(vec[1])), stem, pool, keep))

    # -- identity -----------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        for k in ("vocab_size", "max_seq_len", "positions"):
            del out[k]  # derived from the image facts
        return {"name": out.pop("name"), "task": out.pop("task"),
                "image": {"size": self.image_size, "channels": self.channels, "classes": self.classes},
                "augment": {"pad": self.pad, "flip": self.flip},
                "resolution": list(self.resolutions), "patch": list(self.patches), "stem": list(self.stems),
                "stem_channels": self.stem_channels, **({"pool": list(self.pools)} if self.pools != ("mean",) else {}),
                **out,
                **({"keep": list(self.keeps)} if self.keeps != (tk.FULL,) else {}),  # (absent: hashes as before)
                "latency": {w.name: w.to_dict() for w in self.workloads}}  # fmt: skip


def parse_vision(data: Any, where: str, source: str) -> VisionSpace:
    """An image-classification space (YAML-loaded ``data``); :class:`SpaceError` lists every problem."""
    c = Checker(where)
    top = c.keys("", data, required=("task", "image", "resolution", "patch", "embed_dim", "depth", "layers", "latency"),
                 optional=("name", "head_dim", "stem", "stem_channels", "augment", "pool", "keep"))
    if not top:
        raise SpaceError(c.errors)
    image = c.keys("image", top.get("image", {}), required=("size", "channels", "classes"))
    size = c.pos_int("image.size", image["size"]) if "size" in image else None
    channels = c.choice("image.channels", image.get("channels"), (1, 3)) if "channels" in image else None
    classes = c.pos_int("image.classes", image["classes"]) if "classes" in image else None
    if classes is not None and classes < 2:
        c.error("image.classes", f"{classes}: a classifier needs at least 2 classes")
    aug = c.keys("augment", top.get("augment", {}), required=(), optional=("pad", "flip"))
    pad = aug.get("pad", 2)
    if not is_int(pad) or not 0 <= pad <= 16:
        c.error("augment.pad", f"{shown(pad)} is not an integer from 0 to 16")
    flip = aug.get("flip", True)
    if not isinstance(flip, bool):
        c.error("augment.flip", f"{shown(flip)} is not true or false")
    resolutions = c.int_list("resolution", top["resolution"]) if "resolution" in top else None
    patches = c.int_list("patch", top["patch"]) if "patch" in top else None
    stems = top.get("stem", ["linear"])
    if not isinstance(stems, list) or not stems or any(s not in STEMS for s in stems) or len(set(stems)) != len(stems):
        c.error("stem", f"{shown(stems)} is not a list of distinct choices among {', '.join(STEMS)}")
        stems = None
    stem_channels = c.pos_int("stem_channels", top.get("stem_channels", 16))
    pools = top.get("pool", ["mean"])
    if not isinstance(pools, list) or not pools or any(p not in POOLS for p in pools) or len(set(pools)) != len(pools):
        c.error("pool", f"{shown(pools)} is not a list of distinct choices among {', '.join(POOLS)}")
        pools = None
    keeps = tk.parse_keep(c, top.get("keep"))
    max_seq = None
    if resolutions and patches:
        bad = [(r, p) for r in resolutions for p in patches if r % p]
        for r, p in bad:
            c.error("patch", f"{p} does not divide resolution {r} (the patches tile the image)")
        if stems and "cct" in stems:
            for p in (p for p in patches if p % 2):
                c.error("patch", f"{p} is odd: the cct stem pools the image by 2 first and cuts patches of half the size")
        max_seq = (max(resolutions) // min(patches)) ** 2 + (1 if pools and "cls" in pools else 0)
    if pools and "cls" in pools:
        grid = _grid_types(top.get("layers"))
        if grid:
            c.error("pool", f"cls adds a class token before the grid (T + 1 tokens); the 2D types {', '.join(grid)} read a "
                            "square grid: pool them by mean or seq")
    if resolutions and size is not None:
        for r in resolutions:
            if r > 8 * size or 8 * r < size:
                c.error("resolution", f"{r} is more than 8 times off the image size {size}")
    workloads = _image_workloads(c, top.get("latency"))
    stack = None
    if max_seq is not None and classes is not None:
        body = {k: top[k] for k in ("embed_dim", "depth", "layers", "head_dim") if k in top}
        try:
            stack = parse_stack({"task": TASK, "vocab_size": classes, "max_seq_len": max_seq, "positions": "learned",
                                 "latency": {"prefill": {"batch_size": 1, "seq_len": 1}}, **body},
                                where, source, form="bidirectional")
        except SpaceError as e:
            c.errors.extend(e.errors if hasattr(e, "errors") else [str(e)])
    if stack is not None and resolutions and patches:
        _check_every_grid(c, stack.attention, resolutions, patches)
    if c.errors or stack is None:
        raise SpaceError(c.errors or [f"{where}: not an image-classification space"])
    base = {f.name: getattr(stack, f.name) for f in fields(Space) if f.init}
    base.update(name=top.get("name", base["name"]), workloads=tuple(workloads), source=source, form="bidirectional")
    return VisionSpace(**base, image_size=size, channels=channels, classes=classes, resolutions=resolutions, patches=patches,
                       stems=tuple(stems), stem_channels=stem_channels, pools=tuple(pools), flip=flip, pad=int(pad),
                       keeps=keeps)


def _grid_types(layers: Any) -> list[str]:
    """The 2D types (over a square grid) among a space's listed attention types (the ones that name a registered
    type; the rest the one-stack checks refuse)."""
    from supernet.attention.grid import GridType
    from supernet.attention.registry import get

    kinds = layers.get("attention", []) if isinstance(layers, dict) else []
    out = []
    for spec in kinds if isinstance(kinds, list) else []:
        try:
            if isinstance(get(str(spec)), GridType):
                out.append(str(spec))
        except (KeyError, ValueError, UserError):  # not a type: the one-stack checks say so
            continue
    return out


def _check_every_grid(c: Checker, attention: tuple[str, ...], resolutions: list[int], patches: list[int]) -> None:
    """Each attention type against every grid the space can sample: resolution r at patch p is an (r/p) x (r/p) grid,
    and a 2D type must run on each (a Swin window dividing the largest grid's side may not divide a smaller one's)."""
    sides = sorted({(r // p, r, p) for r in resolutions for p in patches if r % p == 0})
    for i, text in enumerate(attention):
        spec = parse_attention(text)
        for side, r, p in sides:
            for problem in grid_problems(spec, side):
                c.error(f"layers.attention[{i}]", f"{problem} (resolution {r} at patch {p}: every resolution and patch "
                                                  "the space samples must fit)")


def _image_workloads(c: Checker, lat: Any) -> list[ImageWorkload]:
    if not isinstance(lat, dict) or not lat:
        c.error("latency", f"expected a mapping of named image workloads, e.g. {{image: {{batch_size: 1}}}}, got {shown(lat)}")
        return []
    out = []
    for name, w in lat.items():
        w = c.keys(f"latency.{name}", w, required=("batch_size",), optional=("kind",))
        if w and w.get("kind", IMAGE) != IMAGE:
            c.error(f"latency.{name}.kind", f"{shown(w['kind'])}: an image-classification space is timed on image workloads")
        bs = c.pos_int(f"latency.{name}.batch_size", w["batch_size"]) if "batch_size" in w else None
        if bs is not None:
            out.append(ImageWorkload(str(name), bs))
    return out


def describe_vision(space: VisionSpace) -> str:
    """A few human lines about the choices (``nas space``)."""
    tokens = sorted({(r // p) ** 2 for r in space.resolutions for p in space.patches})
    lines = [
        f"space {space.name}  ({space.source}, hash {space.hash})",
        f"  task          {space.task}: {space.image_size} x {space.image_size} x {space.channels} images, {space.classes} "
        f"classes, head_dim {space.head_dim}, 2D learned positions (row + column)",
        f"  resolution    {', '.join(map(str, space.resolutions))}",
        f"  patch         {', '.join(map(str, space.patches))}   (tokens: {', '.join(map(str, tokens))}, a row-major grid)",
        f"  stem          {', '.join(space.stems)}   (conv: 3x3, {space.stem_channels} channels, then the patch embedding; "
        "cct: the 3x3 conv, ReLU, max-pool by 2, then patches of half the size)",
        f"  pool          {', '.join(space.pools)}   (mean over the tokens; seq: attention-weighted; cls: a class token)",
        f"  embed_dim     {', '.join(map(str, space.embed_dim))}",
        f"  depth         {', '.join(map(str, space.depth))}",
        f"  heads         {', '.join(map(str, space.heads))}   (per layer; attention width = heads x {space.head_dim})",
        f"  ffn_dim       {', '.join(map(str, space.ffn_dim))}   (per layer)",
        f"  attention     {', '.join(space.attention)}   (per layer, bidirectional)",
        *([f"  keep          {', '.join(f'{v:g}' for v in space.keeps)}   (per layer, the share of tokens its block runs; "
           "2D types keep all)"] if len(space.keeps) > 1 else []),
        f"  augment       random crop (pad {space.pad})" + (", horizontal flip" if space.flip else "") + " (training only)",
        *(f"  latency       {w}" for w in space.workloads),
        f"  subnets       {space.size():,}",
    ]
    return "\n".join(lines)
