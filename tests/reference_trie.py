"""A literal transcription of the paper's Algorithm 1, used as a test oracle."""

from __future__ import annotations


def windows(tokens: list[int], n: int, prefix_len: int) -> list[tuple[list[int], list[int]]]:
    """Sliding windows over one document: (P_i, S_i) for every start i (tail truncated)."""
    out = []
    for i in range(len(tokens)):
        window = tokens[i : i + n]
        out.append((window[:prefix_len], window[prefix_len:]))
    return out


def build(documents: list[list[int]], n: int, prefix_len: int) -> dict:
    """Nodes as nested dicts: {token: [frequency, children]}; f = 1 per sample."""
    root: dict = {}
    for doc in documents:
        for prefix, suffix in windows(doc, n, prefix_len):
            for j in range(min(prefix_len, len(prefix))):
                node = root
                for t in prefix[j:] + suffix:
                    entry = node.setdefault(t, [0, {}])
                    entry[0] += 1
                    node = entry[1]
    return root


def all_paths(root: dict, prefix: tuple[int, ...] = ()) -> dict[tuple[int, ...], int]:
    out = {}
    for tok, (freq, children) in root.items():
        path = prefix + (tok,)
        out[path] = freq
        out.update(all_paths(children, path))
    return out
