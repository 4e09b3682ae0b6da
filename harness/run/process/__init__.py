"""Process mechanics: how a cell process or warm worker is launched (launch.py, behind the `Launcher`
protocol), started by exec or forked from a template (start.py; the template's client side, template_client.py),
what environment it gets (env.py), the process groups that die with the harness (groups.py), and each cell's GPU
checked back at its baseline once its group is gone (gpu_check.py)."""
