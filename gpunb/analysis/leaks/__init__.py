"""Memory that grows with every step of a profiled cell, and who holds it (`finder`: when to look,
within a time budget; `snapshot`: one look, the census counted per container with its autograd
history; `growth`: the robust slope and the thresholds; `fixes`: the sentence and the fix per pattern).

Uses `memory` (the census names the holders) and the shared `advice`; used by `profile`."""
