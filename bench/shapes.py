"""ResNet-50's 161 gradient tensors (25.6 M parameters, 97.5 MiB in float32), from its
architecture, so no model zoo or download is needed."""


def resnet50_gradient_shapes():
    shapes = [(64, 3, 7, 7), (64,), (64,)]                 # conv1 + bn1
    inplanes = 64
    for planes, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            shapes += [(planes, inplanes, 1, 1), (planes,), (planes,),
                       (planes, planes, 3, 3), (planes,), (planes,),
                       (planes * 4, planes, 1, 1), (planes * 4,), (planes * 4,)]
            if b == 0:                                    # the downsample branch
                shapes += [(planes * 4, inplanes, 1, 1), (planes * 4,), (planes * 4,)]
            inplanes = planes * 4
    shapes += [(1000, 2048), (1000,)]                     # fc
    return shapes


if __name__ == "__main__":
    import math
    s = resnet50_gradient_shapes()
    n = sum(math.prod(x) for x in s)
    print(len(s), "tensors,", n, "parameters,", n * 4 / 2**20, "MiB")
