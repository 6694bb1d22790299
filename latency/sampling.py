"""Which subnets a measurement campaign times: the largest, the smallest, then distinct uniform samples
(:func:`campaign_subnets`), or, for a few-shot transfer, subnets spread over the latency features
(:func:`transfer_subnets`)."""

from __future__ import annotations

import numpy as np

from search_spaces import Space, Subnet, UserError, Workload


def campaign_subnets(space: Space, n: int, seed: int) -> list[Subnet]:
    """``n`` distinct subnets of ``space``: largest and smallest first, then ``space.sample`` draws (seeded).

    The list depends only on (space, n's prefix, seed): asking for more extends it, so a resumed or
    grown campaign measures the same first subnets.
    """
    if n < 2:
        raise UserError(f"--samples: {n} is too few; a campaign always includes the largest and the smallest subnet (give >= 2)")
    if n > space.size():
        raise UserError(f"--samples: {n} exceeds the {space.size()} subnets of space {space.name!r}")
    rng = np.random.default_rng(seed)
    out = {s.key: s for s in (space.largest(), space.smallest())}
    for _ in range(100 * n):  # bounded: a tiny space may run out of new subnets to draw
        if len(out) >= n:
            break
        s = space.sample(rng)
        out.setdefault(s.key, s)
    if len(out) < n:
        raise UserError(
            f"--samples: drew only {len(out)} distinct subnets of space {space.name!r} in {100 * n} tries; ask for fewer"
        )
    return list(out.values())[:n]


def transfer_subnets(space: Space, workload: Workload, n: int, seed: int, pool: int = 40) -> list[Subnet]:
    """``n`` distinct subnets spread over what latency is made of, for a few-shot transfer (``--for-transfer``).

    The largest and the smallest, then, of a seeded pool of ``pool * n`` uniform draws
    (:func:`campaign_subnets`), the member nearest each of ``n - 2`` k-means centres (scikit-learn,
    seeded) in the standardised per-layer additive terms at ``workload`` (each attention type's layer
    count and token mixing, projections, MLP, cache).  Few rows then cover every term a transfer
    rescales, from the smallest to the largest, in proportion to how the space's subnets fill them.
    """
    from sklearn.cluster import KMeans
    from threadpoolctl import threadpool_limits

    from .features import additive_terms, matrix

    if n < 2:
        raise UserError(f"--samples: {n} is too few; a campaign always includes the largest and the smallest subnet (give >= 2)")
    # raises where the space holds fewer than n; at most half a small space, which uniform draws find in their tries
    drawn = campaign_subnets(space, min(pool * n, max(n, space.size() // 2)), seed)
    if n >= len(drawn) or n == 2:
        return drawn[:n]
    x, _ = matrix([additive_terms(space, s, workload) for s in drawn])  # (pool, terms)
    std = x.std(axis=0)
    z = (x - x.mean(axis=0)) / np.where(std > 0, std, 1.0)
    with threadpool_limits(1):  # small matrices: threads only wait on each other
        centres = KMeans(n_clusters=n - 2, n_init=4, random_state=seed).fit(z[2:]).cluster_centers_  # (n - 2, terms)
    taken = {0, 1}  # the largest and the smallest
    for c in centres:
        order = np.argsort(((z - c) ** 2).sum(axis=1), kind="stable")
        taken.add(int(next(i for i in order if i not in taken)))
    return [drawn[i] for i in sorted(taken)]


def retest_subset(subnets: list[Subnet], fraction: float, seed: int) -> list[Subnet]:
    """The seeded share of ``subnets`` measured a second time (test-retest); at least 2 when fraction > 0."""
    if fraction <= 0:
        return []
    rng = np.random.default_rng([seed, 1])
    k = min(len(subnets), max(2, round(fraction * len(subnets))))
    return [subnets[i] for i in sorted(rng.choice(len(subnets), size=k, replace=False))]


# What ``nas fit-predictor`` needs of a timing table: it refuses fewer measured subnets, and reports
# test-retest agreement only with at least this many re-timed ones.
MIN_FIT_SUBNETS = 10
MIN_RETEST_SUBNETS = 5


def campaign_shortfalls(measured: int, retested: int) -> list[str]:
    """What a campaign of ``measured`` subnets (+``retested`` re-timed) will lack when fitted; empty if nothing."""
    out = []
    if measured < MIN_FIT_SUBNETS:
        out.append(
            f"--samples {measured}: nas fit-predictor needs at least {MIN_FIT_SUBNETS} measured subnets and will refuse "
            "this table (100 or more make a predictor worth trusting)"
        )
    if retested < MIN_RETEST_SUBNETS:
        out.append(
            f"{retested} re-timed subnets (--retest share of --samples): the test-retest agreement needs at least "
            f"{MIN_RETEST_SUBNETS}, so the fit will report none"
        )
    return out
