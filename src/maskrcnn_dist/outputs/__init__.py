"""What a user looks at after training, beside the loop: `report` (loss and AP curves, report.py), its
`--gallery` (predictions beside ground truth, gallery.py), and `predict` (drawings and COCO results of
any images, predict.py), all drawn by draw.py. Tools: they never import the training path (train.py).
"""
