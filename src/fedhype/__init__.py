"""fedhype: differentially private synthetic embeddings from a federated hypernetwork CVAE.

Stages (data flows one way): ``data`` → ``encoders`` → ``models`` / ``privacy`` →
``federated`` → ``synthesis`` → ``eval`` / ``prototypes``; ``cli`` sits on top.
"""

__version__ = "0.1.0"
