"""What every GPU language of fastcoll's kernels shares (`language`: the Language descriptor and
read_source), knowing nothing of the gate. Each language is a package beside this one
(fastcoll/metal/, fastcoll/cuda/) that holds its prelude and its LANGUAGE; the fence gate's kernel
body, which joins a prelude with the control page's defines, is the gate's (fastcoll/gate/device/).
"""
