from torchfl_abi import main

main()
