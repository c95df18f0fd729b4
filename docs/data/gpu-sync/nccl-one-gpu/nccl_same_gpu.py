"""Two processes, one GPU, one NCCL communicator: does NCCL accept it? (evidence for the bench's skip)"""
import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp

def run(rank):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    torch.cuda.set_device(0)
    try:
        dist.init_process_group("nccl", rank=rank, world_size=2, device_id=torch.device("cuda", 0))
        t = torch.ones(4, device="cuda:0")
        dist.all_reduce(t)
        torch.cuda.synchronize()
        print(f"rank {rank}: all_reduce on a shared GPU worked: {t.tolist()}", flush=True)
    except Exception as e:
        print(f"rank {rank}: {type(e).__name__}: {str(e)[:400]}", flush=True)
    finally:
        try:
            dist.destroy_process_group()
        except Exception:
            pass

if __name__ == "__main__":
    print("torch", torch.__version__, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count(), flush=True)
    mp.spawn(run, nprocs=2, join=True)
