"""Submit a job definition (jobs/*.yaml) to Azure ML or run it here, from the stack outputs.

python -m launcher jobs/pytorch-resnet50-synthetic.yaml --stack-outputs outputs.dev.json --cluster gpu-ib
"""
