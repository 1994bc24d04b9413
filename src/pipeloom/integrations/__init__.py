"""Other frameworks' runtimes, reached from pipeloom's side.

    torch  torch.distributed.pipelining: pipeloom plans in torch's runtime, torch's schedules in pipeloom
           (imports torch; import it by name)
"""
