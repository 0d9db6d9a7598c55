"""The CT200 twin: the test bench the project deploys to when no GPU host is at hand. A Debian host
booted with systemd-nspawn (host/), a stand-in for SGLang's server (server/) and the fault lab
(faultlab/). The product (dsv4deploy/) never imports it."""
