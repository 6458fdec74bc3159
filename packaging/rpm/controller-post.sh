# slurm-ckpt-controller %post: the state dir for the controller's database (see packaging/debian/controller).
install -d -m 0700 /var/lib/slurm-ckpt
