"""One adapter per operator whose cluster resource the Kubernetes backend scales (``dco``, ``kuberay``, ``daskop``)."""
