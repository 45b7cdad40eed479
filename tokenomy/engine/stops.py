"""Stop strings over a growing text: what may be sent now, and where a stop string cuts it.

One scanner for every answer that can end at a stop string: a sequence's own output
(engine/sequence_output.py) and a token-routed answer written by two models in turns (router/token_routing.py),
where a stop string may span the models' pieces. A tail of the text that could be the start of a stop string is
held back until the next piece shows whether it is one; a matched stop string cuts the text before it, and nothing
after the cut is ever sent.
"""

from __future__ import annotations


class StopScan:
    """`text` is everything fed so far (cut before a matched stop string); `text[:sent]` has been released;
    `matched` is the stop string that cut it (None until one does)."""

    def __init__(self, stop: list[str]) -> None:
        self.stop = [s for s in stop if s]
        self.text = ""
        self.sent = 0
        self.matched: str | None = None

    def feed(self, piece: str, final: bool = False) -> tuple[str, bool]:
        """Append `piece`; the text that may be sent now and whether a stop string matched (the text is cut
        before the first one to start). `final`: no more text follows, so nothing is held back."""
        self.text += piece
        if not self.stop:
            return self.release_all(), False
        # a stop string that ends in the new text starts at most len(stop) - 1 characters before it
        start = max(0, self.sent - max(len(s) for s in self.stop) + 1)
        hits = [(i, s) for s in self.stop if (i := self.text.find(s, start)) >= 0]
        if hits:
            cut, self.matched = min(hits, key=lambda h: h[0])
            out, self.text = self.text[self.sent:cut], self.text[:cut]
            self.sent = cut
            return out, True
        keep = 0
        if not final:
            for s in self.stop:
                for k in range(min(len(s) - 1, len(self.text) - self.sent), 0, -1):
                    if self.text.endswith(s[:k]):
                        keep = max(keep, k)
                        break
        end = len(self.text) - keep
        out, self.sent = self.text[self.sent:end], end
        return out, False

    def release_all(self, piece: str = "") -> str:
        """Append `piece` and release everything not yet sent, a held-back start of a stop string included,
        without matching (a sequence handing its answer over: whoever continues matches the whole text)."""
        self.text += piece
        out, self.sent = self.text[self.sent:], len(self.text)
        return out
