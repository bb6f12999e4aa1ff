"""A multi-tenant character radix tree: which workers were sent which request texts.

The data structure behind SGLang's (and vllm-router's) `cache_aware` policy and Ray Serve's
PrefixCacheAffinityRouter, written from their documentation: each node holds a run of characters
and the set of tenants (workers) whose past requests passed through it; a worker's size is the
number of characters of the tree it owns. Neither peer's eviction is modelled: both evict only
when a worker owns tens of millions of characters (SGLang 67,108,864, vllm-router 33,554,432 per
worker, Ray off by default), more than a benchmark run here inserts in total."""

from __future__ import annotations

from collections.abc import Iterable


class _Node:
    __slots__ = ("children", "tenants", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.children: dict[str, _Node] = {}
        self.tenants: set[str] = set()


def common_prefix_len(edge: str, text: str, offset: int) -> int:
    """How many leading characters of `edge` equal text[offset:] (C-level compares, log steps)."""
    if text.startswith(edge, offset):
        return len(edge)
    lo, hi = 0, min(len(edge), len(text) - offset)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if text.startswith(edge[:mid], offset):
            lo = mid
        else:
            hi = mid - 1
    return lo


class TextPrefixTree:
    """insert(text, tenant); match(text, tenants) -> (matched chars, tenants holding all of them)."""

    def __init__(self) -> None:
        self.root = _Node("")
        self.sizes: dict[str, int] = {}  # tenant -> characters it owns

    def add_tenant(self, tenant: str) -> None:
        self.sizes.setdefault(tenant, 0)

    def insert(self, text: str, tenant: str) -> None:
        self.add_tenant(tenant)
        node, i, n = self.root, 0, len(text)
        while i < n:
            child = node.children.get(text[i])
            if child is None:
                leaf = _Node(text[i:])
                leaf.tenants.add(tenant)
                node.children[text[i]] = leaf
                self.sizes[tenant] += n - i
                return
            k = common_prefix_len(child.text, text, i)
            if k < len(child.text):  # split the edge at k
                mid = _Node(child.text[:k])
                mid.tenants = set(child.tenants)
                child.text = child.text[k:]
                mid.children[child.text[0]] = child
                node.children[text[i]] = mid
                child = mid
            if tenant not in child.tenants:
                child.tenants.add(tenant)
                self.sizes[tenant] += len(child.text)
            node, i = child, i + k

    def match(self, text: str, tenants: Iterable[str] | None = None) -> tuple[int, list[str]]:
        """The longest prefix of `text` some allowed tenant (all when None) holds, in characters, and
        the allowed tenants holding that whole prefix (sorted); (0, []) when none holds any of it."""
        allowed = None if tenants is None else set(tenants)
        node, i, n = self.root, 0, len(text)
        holders: set[str] = set()
        while i < n:
            child = node.children.get(text[i])
            if child is None:
                break
            here = child.tenants if allowed is None else child.tenants & allowed
            if not here:
                break
            k = common_prefix_len(child.text, text, i)
            node, i, holders = child, i + k, here
            if k < len(child.text):
                break
        return i, sorted(holders)

    def smallest(self, tenants: Iterable[str]) -> list[str]:
        """The tenants (of those given) owning the fewest characters."""
        sizes = {t: self.sizes.get(t, 0) for t in tenants}
        if not sizes:
            return []
        least = min(sizes.values())
        return [t for t, s in sizes.items() if s == least]
